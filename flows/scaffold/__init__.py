"""`runledger init`: a team's repository for its own jobs, with runledger as a dependency: the
job module, its entry point, a prefect.yaml, a README section and a test that runs the job twice.
Nothing that exists is overwritten: pyproject.toml and README.md are appended to, and any other
file already there stops the scaffold before it writes anything."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from string import Template
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints

from deployments.project import PREFECT_FILE, job_deployment
from flows.jobs import Job
from flows.registry import ENTRY_POINT_GROUP
from store import InvalidInput

TEMPLATES = Path(__file__).parent


class ScaffoldRefused(InvalidInput):
    """The scaffold would overwrite a file or was given an invalid name; nothing was written."""


@dataclass(frozen=True)
class Scaffold:
    """What `runledger init` writes, for one job of a team's package."""

    folder: Path
    job: str
    package: str
    cadence: str = "daily"
    timezone: str = "UTC"
    due: timedelta = timedelta(hours=7)
    runledger: str = "runledger"

    @property
    def wheel(self) -> Path | None:
        """The runledger wheel given as ``--runledger`` (a path ending in .whl), if any."""
        return Path(self.runledger).expanduser().resolve() \
            if self.runledger.endswith(".whl") else None

    @property
    def module(self) -> str:
        return f"{self.package}.{self.job.replace('-', '_')}"

    @property
    def module_path(self) -> Path:
        return self.folder / self.package / f"{self.job.replace('-', '_')}.py"

    @property
    def test_path(self) -> Path:
        return self.folder / "tests" / f"test_{self.job.replace('-', '_')}.py"

    def check(self) -> Job:
        """The Job the template defines (its name, cadence, timezone and due checked as any
        Job's are), and no file of the scaffold already there."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", self.package):
            raise ScaffoldRefused(f"package must be a Python package name (lowercase, digits, "
                                  f"underscores), got {self.package!r}; set it with --package")
        stage: Any = print  # the stages are the template's; only the schedule fields matter
        job = Job(name=self.job, version="1", cadence=self.cadence, timezone=self.timezone,
                  subjects=[], collect=stage, transform=stage, validate=stage, messages=stage,
                  due=self.due)
        pyproject = self.folder / "pyproject.toml"
        group = f'[project.entry-points."{ENTRY_POINT_GROUP}"]'
        if pyproject.exists() and group in pyproject.read_text(encoding="utf-8"):
            raise ScaffoldRefused(
                f"pyproject.toml already has {group}: add `{self.job} = \"{self.module}\"` "
                "under it by hand; nothing was written")
        if self.wheel is not None and not self.wheel.is_file():
            raise ScaffoldRefused(f"--runledger {self.runledger}: no such wheel file; nothing "
                                  "was written")
        taken = [p for p in (self.module_path, self.test_path, self.folder / "prefect.yaml")
                 if p.exists()]
        if taken:
            raise ScaffoldRefused(
                f"not overwriting {', '.join(str(p.relative_to(self.folder)) for p in taken)}; "
                "nothing was written (choose another --job, or move them away)")
        return job

    def write(self) -> list[str]:
        """Write the scaffold; returns one line per file written or appended to."""
        from flows.jobs.schedule import derived_cron

        job = self.check()
        cron = derived_cron(job)  # before anything is written: a due no cron expresses stops it
        values = {"job": self.job, "module": self.module, "cadence": self.cadence,
                  "timezone": self.timezone, "due_minutes": str(int(self.due.total_seconds()
                                                                  // 60)),
                  "due_text": str(self.due), "period": self.example_period()}
        done: list[str] = []
        package_init = self.folder / self.package / "__init__.py"
        if not package_init.exists():
            package_init.parent.mkdir(parents=True, exist_ok=True)
            package_init.write_text(f'"""{self.package}: jobs run by runledger."""\n')
            done.append(f"created  {package_init.relative_to(self.folder)}")
        self.module_path.write_text(_render("job.py.tmpl", values))
        done.append(f"created  {self.module_path.relative_to(self.folder)}  (job {self.job})")
        self.test_path.parent.mkdir(parents=True, exist_ok=True)
        self.test_path.write_text(_render("test_job.py.tmpl", values))
        done.append(f"created  {self.test_path.relative_to(self.folder)}  (runs it twice)")
        prefect_yaml = self.folder / "prefect.yaml"
        prefect_yaml.write_text(self.prefect_yaml(cron))
        done.append("created  prefect.yaml  (its deployment and runledger's delivery, reconcile, "
                    "prune, backfill, revise)")
        done += self._wheel_copy()
        done.append(self._pyproject())
        readme = self.folder / "README.md"
        existed = readme.exists()
        with readme.open("a", encoding="utf-8") as out:
            if not existed:
                out.write(f"# {self.folder.name}\n")
            out.write(_render("README.md.tmpl", values))
        done.append(f"{'appended' if existed else 'created '} README.md  (a section on the job)")
        return done

    def example_period(self) -> str:
        """A past day for the README and the test (a future period is refused)."""
        return (date.today() - timedelta(days=7)).isoformat()

    def prefect_yaml(self, cron: str) -> str:
        """runledger's own deployments (module entrypoints) plus this job's, on the cron its
        Job derives; build and pull steps that run flows in the folder deployed from."""
        document: dict[str, Any] = yaml.safe_load(PREFECT_FILE.read_text(encoding="utf-8"))
        kept = [d for d in document["deployments"]
                if d["entrypoint"] != "flows.entrypoints.run_job"]
        spec = job_deployment(self.job, cron, self.timezone,
                              description=f"Job {self.job}, defined in {self.module}.")
        ours = {"name": spec.name, "description": spec.description,
                "entrypoint": spec.entrypoint, "parameters": spec.parameters, "tags": spec.tags,
                "work_pool": {"name": spec.work_pool, "work_queue_name": spec.work_queue},
                "schedules": [{"cron": s.cron, "timezone": s.timezone, "slug": s.slug}
                              for s in spec.schedules]}
        document["name"] = self.folder.name
        document["deployments"] = [ours, *kept]
        header = ("# Deployments of this repository's jobs and of runledger's own flows.\n"
                  "# Entrypoints are modules (flows.entrypoints.<flow>): they resolve wherever "
                  "runledger is installed.\n"
                  "# A job's cron must fire at its Job's due time: `runledger check` compares "
                  "them.\n"
                  "#   prefect work-pool create runledger --type process   # once per server\n"
                  "#   prefect --no-prompt deploy --all --prefect-file prefect.yaml\n")
        return header + str(yaml.safe_dump(document, sort_keys=False, width=100))

    def _wheel_copy(self) -> list[str]:
        """The wheel copied into the repository's wheels/ folder, so that pyproject.toml names
        it by a path inside the repository (valid in every clone and on every worker)."""
        if self.wheel is None:
            return []
        copy = self.folder / "wheels" / self.wheel.name
        if copy.resolve() == self.wheel:
            return []
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(self.wheel, copy)
        return [f"copied   {copy.relative_to(self.folder)}  (commit it: pyproject.toml names it)"]

    def _source(self) -> str | None:
        """runledger's uv source as a path relative to the repository: its copied wheel, or a
        checkout given as a folder; None for a requirement from an index."""
        if self.wheel is not None:
            return f"wheels/{self.wheel.name}"
        given = Path(self.runledger).expanduser()
        if not given.is_dir():
            return None
        return Path(os.path.relpath(given.resolve(), self.folder)).as_posix()

    def _pyproject(self) -> str:
        path = self.folder / "pyproject.toml"
        entry = f'{self.job} = "{self.module}"\n'
        source = self._source()
        if not path.exists():
            name = self.folder.name.lower().replace("_", "-")
            text = (f'[project]\nname = "{name}"\nversion = "0.1.0"\n'
                    f'requires-python = ">=3.11"\n'
                    f'dependencies = ["{"runledger" if source else self.runledger}"]\n\n'
                    f'[project.entry-points."{ENTRY_POINT_GROUP}"]\n{entry}\n'
                    '[dependency-groups]\ndev = ["pytest>=8"]\n\n'
                    '[build-system]\nrequires = ["hatchling"]\n'
                    'build-backend = "hatchling.build"\n\n'
                    f'[tool.hatch.build.targets.wheel]\npackages = ["{self.package}"]\n')
            if source:
                text += f'\n[tool.uv.sources]\nrunledger = {{ path = "{source}" }}\n'
            path.write_text(text)
            return "created  pyproject.toml  (runledger dependency, entry point)"
        text = path.read_text(encoding="utf-8")
        group = f'[project.entry-points."{ENTRY_POINT_GROUP}"]'
        path.write_text(text.rstrip("\n") + f"\n\n{group}\n{entry}")
        return (f"appended pyproject.toml  ({group}; runledger must be among its "
                f"dependencies: uv add {'./' + source if source else 'runledger'})")


def _render(name: str, values: dict[str, str]) -> str:
    return Template((TEMPLATES / name).read_text(encoding="utf-8")).substitute(values)
