"""`make docs` fails on any warning: its mkdocs command, run on a two-page site with the
repository's theme and link validation, exits non-zero on a broken link and zero without it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints
from mkdocs.utils.yaml import yaml_load

ROOT = Path(__file__).resolve().parents[2]


def docs_recipe() -> tuple[dict[str, str], list[str]]:
    """The Makefile's `docs` recipe: its environment assignments and mkdocs' arguments."""
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = lines.index(next(line for line in lines if line.startswith("docs:")))
    recipe = next(line for line in lines[start + 1:] if line.startswith("\t")).strip()
    words = shlex.split(recipe)
    run = words.index("run")
    env = dict(w.split("=", 1) for w in words[:run] if "=" in w)
    assert words[run + 1] == "mkdocs", recipe
    return env, words[run + 2:]


def build(tmp_path: Path, index: str) -> subprocess.CompletedProcess[str]:
    """The docs recipe on a site of index.md (``index``) and page.md, configured with the
    repository's theme and validation (its generated pages and plugins are left out: slow)."""
    repo = yaml_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config = {"site_name": "strictness", "docs_dir": "docs", "theme": {"name": repo["theme"]["name"]},
              "strict": repo["strict"], "validation": repo["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(index, encoding="utf-8")
    (tmp_path / "docs" / "page.md").write_text("# Page\n", encoding="utf-8")
    env, args = docs_recipe()
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], cwd=tmp_path,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("link", ["[broken](missing.md)", "[anchor](page.md#nowhere)"])
def test_the_docs_build_fails_on_a_warning(tmp_path: Path, link: str) -> None:
    """A link to a missing page or anchor is a WARNING, and the build exits non-zero."""
    done = build(tmp_path, f"# Home\n\n{link} and [a page](page.md).\n")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "WARNING" in done.stderr and link.split("(")[1].rstrip(")") in done.stderr


def test_the_docs_build_passes_without_a_warning(tmp_path: Path) -> None:
    """The same site with its links right builds (exit 0): the failure above is the link's."""
    done = build(tmp_path, "# Home\n\n[a page](page.md).\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr
