"""The project as a library a lab installs beside its own code: one namespace (the wheel holds
`capsule_rollout` and nothing else at the top), importing it writes no environment variable and registers
nothing, and a user's own top-level `envs` and `models` packages import side by side with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NS = "capsule_rollout"

# Imports the third-party libraries the project uses first (gymnasium and Ray write variables of their own
# at import: PYGAME_HIDE_SUPPORT_PROMPT, RAY_CLIENT_MODE), then every module of the namespace (those needing
# an optional extra that is not installed are skipped and listed), and prints what changed in the
# environment and in gymnasium's registry: what the project itself did.
IMPORT_ALL = r"""
import importlib, json, os, pkgutil, sys
import gymnasium, mujoco, numpy, ray, torch, zarr
before = dict(os.environ)
ids_before = set(gymnasium.registry)
import capsule_rollout
skipped, imported = [], 0
for info in pkgutil.walk_packages(capsule_rollout.__path__, "capsule_rollout."):
    try:
        importlib.import_module(info.name)
        imported += 1
    except ImportError as exc:  # an optional extra (metaworld, pyarrow, ...) that is not installed
        skipped.append(f"{info.name}: {exc}")
after = dict(os.environ)
changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
print(json.dumps({"imported": imported, "skipped": skipped, "changed": changed,
                  "registered": sorted(set(gymnasium.registry) - ids_before)}))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "LP_NUM_THREADS", "RAY_USAGE_STATS_ENABLED", "TRITON_INTERPRET",
            "PYTHONPATH")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def test_importing_every_module_writes_no_environment_variable_and_registers_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, env=_clean_env(),
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["imported"] > 150, report  # the walk reached the layers, not just the root
    assert report["changed"] == [], f"importing {NS} changed the environment: {report['changed']}"
    assert report["registered"] == [], f"importing {NS} registered gymnasium ids: {report['registered']}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project built as users install it (a wheel, no editable finder)."""
    out_dir = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(out_dir), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = out_dir.glob("capsule_rollout-*.whl")
    return path


def test_the_wheel_holds_one_namespace_with_the_shipped_checkpoints(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {NS}, tops
    for part in ("policy", "critic"):
        for file in ("checkpoint.json", "weights.safetensors"):
            assert f"{NS}/checkpoints/{part}/{file}" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    registered = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "capsule-rollout = capsule_rollout.cli.run:cli" in registered
    # the example plugs in as a user's package would: its checkpoint kinds and its suite
    for line in ("flow_policy = capsule_rollout.tabletop.loaders:FLOW_POLICY",
                 "value_critic = capsule_rollout.tabletop.loaders:VALUE_CRITIC",
                 "tabletop = capsule_rollout.tabletop.suite"):
        assert line in registered, registered


def test_a_users_own_envs_and_models_import_beside_it(wheel, tmp_path):
    """A research repo with top-level `envs/` and `models/` (what every such repo has), run from its root,
    with the project installed from the wheel: both sets of modules load from their own files, and the
    project's env, rollout host and shipped policy still work."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    repo = tmp_path / "lab_repo"
    for name in ("envs", "models"):
        (repo / name).mkdir(parents=True)
        (repo / name / "__init__.py").write_text(f"WHO = 'the lab\\'s own {name}'\n")
    script = r"""
import json, envs, models
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.tabletop.flow_policy import load_policy
from capsule_rollout.rollout import rollout_host
import capsule_rollout
env = TabletopEnv("pick_place", cameras=())
obs, _ = env.reset(seed=3)
policy = load_policy(resolve_input("checkpoints/policy"))
print(json.dumps({"envs": envs.WHO, "models": models.WHO, "envs_file": envs.__file__,
                  "project": capsule_rollout.__file__, "host": rollout_host.__file__,
                  "state": len(obs["state"]), "policy": type(policy).__name__}))
"""
    # the wheel's directory stands in for site-packages, ahead of the editable install of this checkout
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=repo, timeout=300,
                         env=_clean_env(PYTHONPATH=str(site)))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["envs"] == "the lab's own envs" and got["models"] == "the lab's own models"
    assert Path(got["envs_file"]).is_relative_to(repo)
    assert Path(got["project"]).is_relative_to(site) and Path(got["host"]).is_relative_to(site)
    assert got["state"] > 0 and got["policy"] == "FlowPolicy"


LEROBOT_VENV = Path(os.environ.get("LEROBOT_VENV", ROOT / ".venv-lerobot"))


@pytest.mark.slow
def test_it_installs_into_lerobots_venv_leaving_lerobots_torch_in_place():
    """`make lerobot-venv` installs LeRobot 0.4.4 (torch 2.10.0, Triton 3.6.0), then this project beside it
    with pip's dry-run report kept: the report installs no torch, torchvision or Triton, `pip check` finds
    every installed package's requirements met (LeRobot's pins included), torch is still 2.10.0 afterwards,
    and LeRobot and the project import and run in one process."""
    python = LEROBOT_VENV / "bin" / "python"
    report_path = LEROBOT_VENV / ".project-dry-run.json"
    if not (LEROBOT_VENV / ".project").exists():
        pytest.skip(f"LeRobot's venv with the project beside it is missing ({LEROBOT_VENV}): `make lerobot-venv`")
    report = json.loads(report_path.read_text())
    would_install = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}
    assert "capsule-rollout" in would_install
    assert not {"torch", "torchvision", "triton"} & set(would_install), would_install
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    script = r"""
import json, torch, lerobot
from importlib.metadata import version
from lerobot.datasets.lerobot_dataset import LeRobotDataset
import capsule_rollout
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from capsule_rollout.rollout.rollout_host import RolloutHost
env = TabletopEnv("stack", cameras=())
obs, _ = env.reset(seed=1)
print(json.dumps({"torch": torch.__version__, "lerobot": version("lerobot"), "state": len(obs["state"]),
                  "project": capsule_rollout.__file__}))
"""
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=600,
                         env=_clean_env(HF_HUB_OFFLINE="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["torch"].startswith("2.10.0"), got
    assert got["state"] > 0 and Path(got["project"]).is_relative_to(ROOT)
