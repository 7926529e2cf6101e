# make demo: set up .venv, build the extension (release), run the demo.
# make test: same set-up, then lint, cargo test, the release wheel's check (make wheel), and
#            pytest on every CPython 3.9-3.13 found (noxfile.py; a missing one is skipped with
#            a notice), in parallel lanes, one per core (.ci/nox_lanes.py).
#            NOX_ARGS passes options to nox's pytest sessions, e.g.
#            make test NOX_ARGS='-p 3.12 -- tests/unit/text/test_size.py'.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(VENV)/.deps-installed
WHEELS := target/wheels
NOX_ARGS ?=
# cargo without make's jobserver: under `make test`'s -j2 it would try to join it and warn
# ("failed to connect to jobserver"); it sizes its own jobs by the cores.
CARGO  := env -u MAKEFLAGS -u MFLAGS cargo

.PHONY: demo test build wheel lint bench clean

# Bytecode is written as modules are first imported: with PYTHONDONTWRITEBYTECODE set (as on
# this project's machines) every `import torch` would compile its sources again, and uv writes
# none at install (its --compile-bytecode compiles all of torch: 33 s of CPU, where what an
# import needs takes about 2 s). An empty value turns the setting off for every recipe.
export PYTHONDONTWRITEBYTECODE :=

# uv installs: it keeps every wheel unpacked in its cache (~/.cache/uv) and hard-links it here
# and into the test environments of noxfile.py, so torch's ~5 GB are fetched and unpacked once.
$(DEPS): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(BIN)/uv pip install -q --python $(BIN)/python -r requirements-dev.txt
	touch $@

# Build the release wheel and install it, so tests run against what users get: the very wheel
# a release uploads. It is built from the sdist, as PyPA's `python -m build` does
# (.ci/wheel_from_sdist.py), so that a file missing from the sdist fails the build; both land
# in target/wheels. The wheel is manylinux2014 (glibc >= 2.17: RHEL/Rocky 8, Ubuntu 20.04 and
# older clusters): zig, from PyPI's ziglang, links it against glibc 2.17's symbol versions,
# where the system linker would tie it to this machine's glibc (2.36 here gave manylinux_2_34).
# Zig for every build, not a separate release target: on this 2-core machine it cost the same
# (cold 106 s against 101 s, after a change to src/ 40-51 s against 39-46 s), and one build
# means every test session tests exactly what users install. Zig's objects go to
# target/<triple>/.
build: $(DEPS)
	$(BIN)/python .ci/wheel_from_sdist.py $(WHEELS)
	$(BIN)/python -m pip install -q --no-deps --force-reinstall $(WHEELS)/memlab_rs-*.whl

# The release wheel and the sdist as users get them (noxfile.py's `wheel` session): auditwheel
# says manylinux2014; the wheel installs and works in a clean environment without cargo or
# rustc; the sdist `make build` built the wheel from holds the sources.
wheel: build
	$(BIN)/nox -s wheel

demo: build
	$(BIN)/python -m memlab_rs.demo

# One wheel (abi3, built by `build`) is installed into a fresh environment per Python. On a
# 2-core machine `make test`'s wall-clock time is what to save, so work that does not wait
# on the other runs beside it: the test environments (torch and the rest, for each Python)
# are made while the wheel builds (rustc checks our crate on one core for much of the
# build), and the checks that need no wheel of their own (lint, cargo test, the wheel's and
# sdist's checks) run beside the pytest sessions, which alone leave a core idle for part of
# their time (fresh interpreters reading files). --output-sync keeps each side's log whole.
test: $(DEPS)
	$(MAKE) --no-print-directory -j2 --output-sync=target build test-envs
	$(MAKE) --no-print-directory -j2 --output-sync=target test-checks test-sessions

.PHONY: test-checks test-sessions test-envs
# noxfile.py's test environments, without the wheel (each session installs it when it runs).
test-envs: $(DEPS)
	MEMLAB_RS_ENVIRONMENTS_ONLY=1 $(BIN)/nox -s tests

# cargo test's debug build without debug info (CARGO_PROFILE_DEV_DEBUG=0): 40 s instead of
# 53 s on the 2-core machine; a failing test's panic message still names its file and line.
test-checks: lint
	CARGO_PROFILE_DEV_DEBUG=0 $(CARGO) test --quiet
	$(BIN)/nox -s wheel

test-sessions:
	$(BIN)/python .ci/nox_lanes.py $(NOX_ARGS)

# The layering checks: arrows point down (CONTRIBUTING.md, "Architecture"). lint-imports
# (import-linter) reads pyproject.toml's contracts and the sources under python/ (PYTHONPATH:
# not the installed wheel, which may be older than the sources).
lint: $(DEPS)
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(BIN)/ruff check python tests bench docs
	$(BIN)/python -m mypy python/memlab_rs python/pytest_memlab_rs
	PYTHONPATH=python $(BIN)/lint-imports --no-cache --no-logo
# src/'s layering (.ci/rust_layers.py): floors below rooms, no circles, pyo3 only in binding files.
	$(BIN)/python .ci/rust_layers.py

bench: build
	$(BIN)/python bench/reporter_walk.py
	$(BIN)/python bench/line_profiler_overhead.py
	$(BIN)/python bench/line_event_cost.py
	$(BIN)/python bench/courtesy_bandwidth.py

clean:
	rm -rf $(VENV) target
