# `make test` and `make demo` work on a fresh machine with nothing but Python:
# they create .venv, install torch, then this project (editable), then run.
#
# GPU users pick another torch build, e.g.
#   make test TORCH_SPEC=torch==2.13.0 TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128"

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=
DEMO_OUT ?= runs/demo

PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_USAGE_STATS_ENABLED ?= 0
export PYTHONUNBUFFERED ?= 1

.PHONY: install test test-slow demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS)

# Until the rollout layer lands, the demo is the capsule bit-exactness report, the
# capsule benchmark and a few expert demonstrations; JSON summaries go to $(DEMO_OUT).
demo: $(STAMP)
	$(PY) -m experiments.run verify_capsule --json $(DEMO_OUT)/verify_capsule.json
	$(PY) -m experiments.run bench_capsules --quick --json $(DEMO_OUT)/bench_capsules.json
	$(PY) -m experiments.run collect_demos --episodes 10 --out $(DEMO_OUT)/demos.zarr --json $(DEMO_OUT)/collect_demos.json

bench: $(STAMP)
	$(PY) -m experiments.run bench_capsules --json runs/bench/bench_capsules.json --docs docs/BENCHMARKS.md
	$(PY) -m experiments.run bench_env --json runs/bench/bench_env.json --docs docs/BENCHMARKS.md

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
