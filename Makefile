# The two commands people need: `make run` (the main job) and `make test` (the whole suite).
# Both bootstrap uv with pip when it is missing, then install the locked dependencies.
# `--inexact`: what a person installed into .venv besides the lock (their own jobs' package,
# `uv pip install -e ../acme-jobs`) stays installed; plain `uv sync` would remove it.
PY ?= python3
UV := $(shell command -v uv 2>/dev/null || echo "$(PY) -m uv")

.PHONY: setup run test suite test-fast lint docs bench screenshots drills
# Bytecode compiled once at install: where PYTHONDONTWRITEBYTECODE is set, every process (each
# Prefect server, worker and CLI run of the suite) would otherwise compile Prefect from source.
setup:
	@$(UV) --version >/dev/null 2>&1 || $(PY) -m pip install --quiet "uv>=0.5"
	@$(UV) sync --frozen --inexact --quiet --compile-bytecode

# The local stack: migrate ./runledger.db, Prefect server + UI on http://127.0.0.1:4200, the SMTP
# sink writing .eml files to .runledger/mail, `runledger serve` with every schedule, one run of
# the reference job and one delivery pass; Ctrl-C stops everything (options: ARGS="--help").
run: setup
	$(UV) run --no-sync runledger stack up $(ARGS)

# Style, strict types, the import contracts (pyproject's [tool.importlinter]) and the committed
# SQL of every named statement (store/sql/*.sql; `python -m store.sql --write` rewrites them).
# mypy keeps its cache outside the checkout, one per lock and mypy configuration: a fresh clone
# (CI's) then checks only what changed instead of the whole dependency tree three times over.
MYPY_CACHE := $(HOME)/.cache/runledger/mypy/$(shell cat uv.lock pyproject.toml | sha256sum | cut -c1-16)

lint: setup
	$(UV) run ruff check store flows deployments tests bench docs
	$(UV) run mypy --cache-dir $(MYPY_CACHE)/code store flows deployments tests
	$(UV) run mypy --cache-dir $(MYPY_CACHE)/bench --explicit-package-bases bench
	$(UV) run mypy --cache-dir $(MYPY_CACHE)/docs --strict docs/gen_reference.py docs/hooks.py docs/screenshots.py
	$(UV) run lint-imports --no-cache
	$(UV) run python -m store.sql

# The documentation site, built strictly: any WARNING (a broken link, a missing page, a settings
# field without a description) fails it. Not --quiet: that drops the warnings --strict counts
# (tests/unit/test_docs_build.py proves a broken link fails this command). The reference pages
# are generated from the code by docs/hooks.py.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(UV) run mkdocs build --strict --site-dir site

# Lint and the docs build run beside the suite (a third of its time is spent waiting on real
# schedules and processes, so two cores have room for them): any of the three failing fails
# `make test`, after all three ended. Each one's output is printed whole when it ends (the
# suite's last: `make suite` shows its progress as it goes).
test: setup
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint docs suite

# Three pytest-xdist workers on two cores: the acceptance tests that share one stack (a real
# server and workers, mostly waiting on real schedules) on one of them, so that the other two keep
# both cores busy with everything else. The JUnit report feeds the durations summary (per layer,
# xdist group and module: `uv run python -m tests.support.durations reports/junit.xml`).
suite: setup
	@status=0; $(UV) run pytest -q -n 3 --dist loadgroup --durations=15 \
		--junitxml=reports/junit.xml || status=$$?; \
	$(UV) run --no-sync python -m tests.support.durations reports/junit.xml; exit $$status

# The inner loop: unit tests and the SQLite half of integration, without the tests that start or
# kill other processes (the `processes` marker), on four xdist workers (they mostly wait).
test-fast: setup
	$(UV) run pytest -q -n 4 -m "(unit or integration) and not postgres and not processes"

# The drills that break things on purpose (docs/how-to/fault-points.md) at full size: drill 1
# with 1,000 Runs and 100 kills per ledger, drill 3 with 200 Runs and 10 restarts of a private
# PostgreSQL, drill 4 with 2,000 messages per ledger, drill 5 with ticks of 1,000 and 10,000
# subjects, the batch drill (issue 48) with 1,000 Runs and 100 kills per ledger, and the host
# drills (tests/hosts: network namespaces, as root) with all six scenarios (the suite runs them
# reduced; scenario 4 needs Debian's faketime, installed here when missing), the installed
# package's tests and the full `make run` drill; at the end, the wall time of each drill.
drills: setup
	@test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || apt-get install -y -q faketime
	RUNLEDGER_FULL=1 $(UV) run pytest -q -s --durations=40 tests/integration/test_fault_points.py \
		tests/integration/test_commit_cut.py tests/drills tests/hosts tests/acceptance/test_installed_package.py \
		"tests/acceptance/test_local_stack.py::test_stack_up_runs_the_reference_job_delivers_mail_and_stops_cleanly_on_ctrl_c"

bench: setup
	$(UV) run python bench/ledger_bench.py

# Retake the Prefect UI pictures in docs/images/ from a local stack of their own (needs Debian's
# chromium: apt-get install -y chromium); look at each before committing them.
screenshots: setup
	$(UV) run python docs/screenshots.py
