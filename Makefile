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

# The demo: the shipped policy and critic on 2 Ray actors (local cluster), episodes
# recorded to zarr with a plot and a gif; then one episode replayed bit for bit from
# its initial capsule, and the capsule bit-exactness report. Outputs in $(DEMO_OUT).
demo: $(STAMP)
	rm -rf $(DEMO_OUT)/sim_rollout
	$(PY) -m experiments.run sim_rollout --actors 2 --episodes 10 --out $(DEMO_OUT)/sim_rollout --json $(DEMO_OUT)/sim_rollout.json
	$(PY) -m experiments.run replay --store $(DEMO_OUT)/sim_rollout/episodes.zarr --episode pick_place-s1000000 --json $(DEMO_OUT)/replay.json
	$(PY) -m experiments.run verify_capsule --json $(DEMO_OUT)/verify_capsule.json

bench: $(STAMP)
	$(PY) -m experiments.run bench_capsules --json runs/bench/bench_capsules.json --docs docs/BENCHMARKS.md
	$(PY) -m experiments.run bench_env --json runs/bench/bench_env.json --docs docs/BENCHMARKS.md
	$(PY) -m experiments.run bench_policy --json runs/bench/bench_policy.json --docs docs/BENCHMARKS.md
	$(PY) -m experiments.run bench_rollout --json runs/bench/bench_rollout.json --docs docs/BENCHMARKS.md

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
