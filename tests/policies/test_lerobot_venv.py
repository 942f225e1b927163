"""LeRobot's own policies rolled out here, in LeRobot 0.4.4's venv (`make lerobot-venv`; this checkout's code on its
PYTHONPATH): an ACT and a Diffusion Policy trained by `lerobot-train` on an `export_lerobot` of scripted demos (2
steps each: what is checked is the checkpoint LeRobot writes, its processors and its state between calls, not its
skill; a trained one is in BENCHMARKS), then the adapter against LeRobot's `select_action`, restores in the middle of
the action queue, and `eval_policy`, `sim_rollout --actors 2 --slots 4` and `replay` with each."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("av")

from capsule_rollout.cli.run import main  # noqa: E402
from capsule_rollout.stores.lerobot_writer import LeRobotWriterOptions, export_lerobot, open_store  # noqa: E402
from capsule_rollout.stores.sharded_reader import open_episode_reader  # noqa: E402
from capsule_rollout.stores.zarr_reader import store_episodes  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
LEROBOT_PYTHON = Path(os.environ.get("LEROBOT_PYTHON", ROOT / ".venv-lerobot" / "bin" / "python"))
CHECKS = Path(__file__).with_name("lerobot_checks.py")
# small networks, so that 2 training steps and the rollouts stay short on a CPU
TRAIN = {
    "act": ["--policy.type=act", "--policy.chunk_size=6", "--policy.n_action_steps=4", "--policy.dim_model=64",
            "--policy.dim_feedforward=128", "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1"],
    "diffusion": ["--policy.type=diffusion", "--policy.n_obs_steps=2", "--policy.horizon=8",
                  "--policy.n_action_steps=4", "--policy.drop_n_last_frames=3", "--policy.down_dims=[32,64]",
                  "--policy.num_inference_steps=4"],
}


def _env(tmp: Path) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf"), "PYTHONPATH": str(ROOT),
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "RAY_USAGE_STATS_ENABLED": "0"}


def _run(args: list[str], tmp: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([str(LEROBOT_PYTHON), *args], env=_env(tmp), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """An ACT and a Diffusion Policy from `lerobot-train` on an export of 4 scripted episodes."""
    if not LEROBOT_PYTHON.exists():
        pytest.skip(f"LeRobot 0.4.4's venv is missing ({LEROBOT_PYTHON}): `make lerobot-venv` builds it "
                    "(`make test-slow` does), or set LEROBOT_PYTHON")
    base = tmp_path_factory.mktemp("lerobot_policies")
    assert main(["collect_demos", "--episodes", "4", "--out", str(base / "demos.zarr"), "--no-progress"]) == 0
    store = open_store(base / "demos.zarr")
    export_lerobot(store_episodes(store, range(len(store))), base / "dataset", LeRobotWriterOptions(fps=10))
    made = {}
    for name, options in TRAIN.items():
        _run(["-m", "lerobot.scripts.lerobot_train", "--dataset.repo_id=capsule-rollout/demos",
              f"--dataset.root={base / 'dataset'}", "--dataset.video_backend=pyav", *options, "--policy.device=cpu",
              "--policy.push_to_hub=false", "--policy.pretrained_backbone_weights=null", "--steps=2",
              "--batch_size=2", "--num_workers=0", "--save_freq=2", "--eval_freq=0", "--wandb.enable=false",
              f"--output_dir={base / name}"], base)
        made[name] = base / name / "checkpoints" / "last" / "pretrained_model"
        assert (made[name] / "config.json").is_file() and (made[name] / "policy_preprocessor.json").is_file()
    return made


def test_the_adapter_is_select_action_with_its_state_in_capsules(checkpoints, tmp_path):
    """Bit for bit LeRobot's `select_action` (its processors, history and queue; Diffusion's noise from the
    adapter's generator); one model for 3 slots; slot 1's episode forked mid-queue into slot 2 plays on as it did;
    a branch's new noise keeps the queued actions and changes Diffusion's later ones; describing a checkpoint
    imports no LeRobot."""
    out = tmp_path / "checks.json"
    _run([str(CHECKS), str(checkpoints["act"]), str(checkpoints["diffusion"]), str(out)], tmp_path)
    found = json.loads(out.read_text())
    assert found["core_loads_no_lerobot"]
    for name, steps in (("act", (1, 4)), ("diffusion", (2, 4))):
        calls, slots = found[name]["select_action"], found[name]["slots"]
        assert calls["equal"] and (calls["n_obs_steps"], calls["n_action_steps"]) == steps
        assert calls["network_calls"] == 4  # 14 steps, 4 actions a call
        assert slots["models_loaded"] == 1 and slots["policy_instances"] == 1, slots
        assert slots["record"]["slots"] == 3 and slots["record"]["policy_instances"] == 1
        assert slots["queue_left_at_capsule"] == 1  # step 3: the last action of the first call still queued
        assert slots["fork_equal"] and slots["new_noise_queued_equal"]
    assert found["diffusion"]["slots"]["new_noise_later_differs"]  # it samples
    assert not found["act"]["slots"]["new_noise_later_differs"]  # ACT samples nothing at inference


@pytest.mark.parametrize("name", ["act", "diffusion"])
def test_eval_policy_sim_rollout_on_two_actors_of_four_slots_and_replay(checkpoints, name, tmp_path):
    policy = str(checkpoints[name])
    _run(["-m", "capsule_rollout", "eval_policy", "--model.policy", policy, "--family", "pick_place",
          "--seeds.count", "4", "--slots", "2", "--no-expert", "--json", str(tmp_path / "eval.json")], tmp_path)
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert evaluated["n_exec"] == 1 and evaluated["policy"]["episodes"] == 4
    assert evaluated["policy"]["instances_by_actor"] == {"0": {"policy": 1, "critic": 0, "slots": 2}}
    run = tmp_path / "run"
    _run(["-m", "capsule_rollout", "sim_rollout", "--model.policy", policy, "--family", "pick_place", "--actors", "2",
          "--slots", "4", "--seeds.count", "8", "--max_steps", "24", "--out", str(run), "--json",
          str(tmp_path / "sim.json"), "--no-progress", "--no-video"], tmp_path)
    summary = json.loads((tmp_path / "sim.json").read_text())
    assert summary["episodes"] == 8 and summary["lost"] == 0 and summary["slots"] == 4
    # one LeRobot model per actor serves its 4 slots (the shipped critic too); which actors play depends on when
    # each is placed (an actor ready first takes what is left once its call is done), so: each actor that played
    by_actor = summary["instances_by_actor"]
    assert by_actor and set(by_actor) <= {"0", "1"}, by_actor
    assert all(n == {"policy": 1, "critic": 1, "slots": 4} for n in by_actor.values()), by_actor
    reader = open_episode_reader(run / "episodes.zarr")
    assert len(reader) == 8 and all(reader.meta(i).length <= 24 for i in range(8))
    for episode in (reader.episode_ids[0], reader.episode_ids[-1]):
        _run(["-m", "capsule_rollout", "replay", "--store", str(run / "episodes.zarr"), "--episode", episode,
              "--json", str(tmp_path / "replay.json")], tmp_path)
        assert json.loads((tmp_path / "replay.json").read_text())["exact"] is True


def test_the_lerobot_example_runs(checkpoints, tmp_path):
    out = _run(["-m", "examples.lerobot_policy", str(checkpoints["diffusion"])], tmp_path)
    assert "1 policy instance for 4 slots" in out.stdout
    assert "the actions that follow are the episode's bit for bit: True" in out.stdout


def test_bench_lerobot_policy_smoke(checkpoints, tmp_path):
    docs, out = tmp_path / "B.md", tmp_path / "bench.json"
    docs.write_text("# Benchmarks\n")
    _run(["-m", "benchmarks.lerobot_policy", "--policies", str(checkpoints["act"]), "--rounds", "1",
          "--calls", "2", "--slots", "2", "--episodes", "2", "--max_steps", "6", "--docs", str(docs), "--json",
          str(out)], tmp_path)
    [measured] = json.loads(out.read_text())["policies"]
    assert measured["type"] == "act" and measured["adapter"]["call_ms"] > 0 and measured["direct"]["call_ms"] > 0
    assert measured["slots"]["instances"] == 1 and measured["slots"]["steps_per_s"]["slots"] > 0
    assert "<!-- bench_lerobot_policy:begin -->" in docs.read_text()
