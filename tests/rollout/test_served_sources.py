"""What `serve_policy` serves is whatever the project loads, acting as it would in process: a `TorchPolicy`
checkpoint, and a flow-policy checkpoint with RECAP conditioning (indicator and guidance weight), played through
the server seed for seed as in process."""

from __future__ import annotations

import numpy as np
import torch

from capsule_rollout.policies.rollout_policy import PolicySpec
from capsule_rollout.policies.state_mlp import StateMLP
from capsule_rollout.policies.torch_policy import save_torch_policy
from capsule_rollout.rollout.host_factory import RunSpec, build_host
from capsule_rollout.rollout.policy_server import PolicyServer, serve_spec
from capsule_rollout.rollout.rollout_host import HostConfig
from tests.policies.tiny import save_tiny_checkpoints

KEYS = ("action", "policy_action", "state", "reward")


def _same_episodes(served_spec: RunSpec, seeds=(0, 1), **host) -> int:
    """Plays `seeds` (and a repeat of the first) in process and through a server of the same spec; the length
    played. The client's spec is the env and the server's address alone."""
    steps = 0
    with PolicyServer(serve_spec(served_spec)) as server:
        remote = build_host(RunSpec(env=served_spec.env, policy=server.url, host=served_spec.host))
        local = build_host(served_spec)
        for seed, repeat in [(s, 0) for s in seeds] + [(seeds[0], 1)]:
            a, b = remote.run_episode(seed, repeat=repeat), local.run_episode(seed, repeat=repeat)
            assert a.error == b.error == "" and a.meta.stop_reason == b.meta.stop_reason
            for key in KEYS:
                assert np.array_equal(a.episode.steps[key], b.episode.steps[key], equal_nan=True), (seed, key)
            steps += a.meta.length
        remote.close()
        local.close()
    return steps


def test_a_torch_policy_checkpoint_served(tmp_path):
    torch.manual_seed(0)
    save_torch_policy(tmp_path / "policy", StateMLP(6, 2, 8, hidden=16),
                      factory="capsule_rollout.policies.state_mlp:StateMLP",
                      kwargs={"state_dim": 6, "action_dim": 2, "chunk_length": 8, "hidden": 16},
                      spec=PolicySpec(8, 2, ("state",)), shapes={"state": ((6,), "float32")})
    spec = RunSpec(env="examples.own_env_and_policy:make_env", policy=str(tmp_path / "policy"),
                    host=HostConfig(n_exec=4, max_steps=40))
    assert serve_spec(spec).metadata()["observation"] == {"state": {"key": "state", "shape": [6], "dtype": "float32"}}
    assert _same_episodes(spec) > 0


def test_a_recap_conditioned_flow_policy_served_with_its_conditioning(tmp_path):
    policy, _ = save_tiny_checkpoints(tmp_path)
    spec = RunSpec(env="tabletop:pick_place", policy=policy, advantage="positive", beta=2.0,
                    host=HostConfig(n_exec=2, max_steps=12))
    meta = serve_spec(spec).metadata()
    assert meta["conditioning"] == {"advantage": "positive", "beta": 2.0}
    assert meta["observation"]["image_front"]["shape"] == [16, 16, 3] and meta["prompt"]["used"]
    assert _same_episodes(spec, seeds=(3, 4)) > 0
    # the conditioning matters: unconditioned, the same seed plays other actions
    with PolicyServer(serve_spec(RunSpec(env=spec.env, policy=policy, host=spec.host))) as plain:
        host = build_host(RunSpec(env=spec.env, policy=plain.url, host=spec.host))
        other = host.run_episode(3).episode.steps["policy_action"]
        host.close()
    local = build_host(spec)
    conditioned = local.run_episode(3).episode.steps["policy_action"]
    local.close()
    assert not np.array_equal(other[:2], conditioned[:2])
