"""The real openpi-client (its own venv: it pins numpy < 2) drives `serve_policy`: `WebsocketClientPolicy.infer`
and `ActionChunkBroker` get the served policy's own chunks for the same observations (the example's `infer`
policy, and the tabletop's flow policy with its prompt), with openpi's key names too, and a wrong request comes
back as the client's error. `make test-slow` builds that venv (`make openpi-venv`) and runs this file with it
(a missing venv then fails); the default run skips it when the venv is missing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from capsule_rollout.capsules import restore
from capsule_rollout.envs.suites import make_env
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.policy_server import PolicyServer, serve_spec

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("openpi_client_driver.py")
PYTHON_ENV = "CAPSULE_ROLLOUT_OPENPI_PYTHON"  # set by `make test-slow`: then a missing venv fails the test
SHIPPED = str(ROOT / "capsule_rollout" / "checkpoints" / "policy")


def _openpi_python() -> str:
    given = os.environ.get(PYTHON_ENV)
    python = Path(given) if given else ROOT / ".venv-openpi" / "bin" / "python"
    if not python.exists():
        if given:
            pytest.fail(f"{PYTHON_ENV}={given} does not exist: run `make openpi-venv`")
        pytest.skip("openpi-client's venv is missing (.venv-openpi): `make openpi-venv` builds it")
    return str(python)


def _observations(env_id: str, keys: tuple[str, ...], cameras=None) -> list[dict]:
    env = make_env(env_id, cameras=cameras)
    obs, _ = env.reset(seed=7)
    seen = [obs]
    low, high = env.action_space.low, env.action_space.high
    for t in range(2):
        obs = env.step(((low + high) / 2 + (high - low) * 0.3 * (-1) ** t).astype(np.float32))[0]
        seen.append(obs)
    env.close()
    return [{k: np.asarray(o[k]) for k in keys} for o in seen]


def _expected(served, observations, prompt: str, seed: int = 0) -> list[np.ndarray]:
    """The served policy's own chunks in this process: reset(seed), the prompt, each observation in turn."""
    policy = served.policy
    restore(served.arena, served.base)
    policy.reset(seed)
    if served.language:
        policy.set_language(prompt)
    chunks = []
    for obs in observations:
        policy.load_observation(obs)
        chunks.append(policy.act().detach().reshape(served.shape).cpu().numpy().copy())
    return chunks


def _drive(python: str, url: str, observations: list[dict], wire: dict[str, str], prompt: str, tmp_path,
           token: str = "") -> dict:
    arrays = {f"o{i}/{w}": obs[k] for i, obs in enumerate(observations) for w, k in wire.items()}
    np.savez(tmp_path / "obs.npz", prompt=np.array(prompt), **arrays)
    done = subprocess.run([python, str(DRIVER), url, str(tmp_path / "obs.npz"), str(tmp_path / "out.npz"), token],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz", allow_pickle=False) as out:
        return {k: out[k] for k in out.files}


@pytest.mark.parametrize("env_id, policy, keys, prompt, token", [
    ("examples.own_env_and_policy:make_env", "examples.own_env_and_policy:make_policy", "project", "push it", ""),
    ("examples.own_env_and_policy:make_env", "examples.own_env_and_policy:make_policy", "openpi", "push it", "t0ken"),
    ("tabletop:pick_place", SHIPPED, "project", "pick up the red block", ""),
])
def test_openpi_client_and_its_chunk_broker_get_the_policys_own_chunks(env_id, policy, keys, prompt, token, tmp_path):
    """(The token: openpi-client's api_key is what the server checks.)"""
    python = _openpi_python()
    served = serve_spec(RunSpec(env=env_id, policy=policy), keys=keys)
    observations = _observations(env_id, served.policy.spec.observation_keys)
    expected = _expected(served, observations, prompt)
    with PolicyServer(served, token=token) as server:
        out = _drive(python, server.url, observations, dict(served.wire), prompt, tmp_path, token)
        assert server.counts["refused"] == 0 and server.counts["connections"] == 2
    meta = json.loads(str(out["metadata"]))
    assert meta["observation"] == json.loads(json.dumps(served.metadata()["observation"]))
    assert meta["action_horizon"] == served.shape[0] and meta["prompt"]["key"] == "prompt"
    for i, chunk in enumerate(expected):
        assert out[f"infer{i}"].dtype == np.float32 and np.array_equal(out[f"infer{i}"], chunk), i
        assert np.array_equal(out[f"broker{i}"], chunk), i  # the broker's rows, one call at a time
    assert "Error in inference server" in str(out["error"]) and "float64, expected" in str(out["error"])
