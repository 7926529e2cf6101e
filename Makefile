# make demo: set up .venv, build the extension (release), run the demo.
# make test: same set-up, then lint, cargo test, and pytest on every CPython 3.9-3.13 found
#            (noxfile.py; a missing one is skipped with a notice). NOX_ARGS passes options
#            to nox, e.g. make test NOX_ARGS='-p 3.12 -- tests/test_size.py'.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEPS   := $(VENV)/.deps-installed
WHEELS := target/wheels
NOX_ARGS ?=

.PHONY: demo test build lint bench clean

# uv installs: it keeps every wheel unpacked in its cache (~/.cache/uv) and hard-links it here
# and into the test environments of noxfile.py, so torch's ~5 GB are fetched and unpacked once.
$(DEPS): requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv
	$(BIN)/uv pip install -q --python $(BIN)/python -r requirements-dev.txt
	touch $@

# Build a release wheel and install it, so tests run against what users get.
build: $(DEPS)
	rm -rf $(WHEELS)
	$(BIN)/maturin build --release --quiet -o $(WHEELS)
	$(BIN)/python -m pip install -q --no-deps --force-reinstall $(WHEELS)/memlab_rs-*.whl

demo: build
	$(BIN)/python -m memlab_rs.demo

# One wheel (abi3, built by `build`) is installed into a fresh environment per Python.
test: build lint
	cargo test --quiet
	$(BIN)/nox $(NOX_ARGS)

lint: $(DEPS)
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	$(BIN)/ruff check python tests bench docs
	$(BIN)/python -m mypy python/memlab_rs python/pytest_memlab_rs

bench: build
	$(BIN)/python bench/reporter_walk.py
	$(BIN)/python bench/line_profiler_overhead.py
	$(BIN)/python bench/line_event_cost.py
	$(BIN)/python bench/courtesy_bandwidth.py

clean:
	rm -rf $(VENV) target
