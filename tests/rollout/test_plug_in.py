"""Your own policy and critic objects in the one loop: `infer(obs)` and `value(obs)` wrapped as capsule
components, restored bit for bit mid-episode, and every way an object can be unfit refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capsule_rollout.envs.suites import make_env
from capsule_rollout.policies.infer_policy import InferPolicy
from capsule_rollout.rollout.branching import branch_episode
from capsule_rollout.rollout.rollout_host import HostConfig, RolloutHost
from capsule_rollout.rollout.sources import as_rollout_critic, as_rollout_policy, source_kind
from capsule_rollout.user_code import ContractError

ENV = "examples.own_env_and_policy:make_env"


class NoisyPush:
    """An openpi-shaped policy whose chunks depend on the noise it is handed; it records what it was asked."""

    chunk_length = 6

    def __init__(self):
        self.seen_prompts: list[str | None] = []

    def infer(self, obs, *, noise):
        self.seen_prompts.append(obs.get("prompt"))
        s = obs["state"]
        return {"actions": np.clip(2.0 * (s[4:6] - s[0:2]) + 0.5 * noise, -1.0, 1.0)}


class Distance:
    def value(self, obs):
        s = obs["state"]
        return -float(np.linalg.norm(s[4:6] - s[0:2])) - 0.001 * obs["step"]


class Deterministic:
    deterministic = True

    def infer(self, obs):
        return np.zeros((3, 2), np.float32)


def _host(policy=None, critic=None) -> RolloutHost:
    env = make_env(ENV, cameras=())
    return RolloutHost(env=env, policy=as_rollout_policy(policy or NoisyPush(), env),
                       critic=as_rollout_critic(critic or Distance(), env), config=HostConfig(n_exec=3))


def test_an_infer_policy_and_critic_replay_and_branch_bit_for_bit():
    host = _host()
    first = host.run_episode(4)
    again = host.run_episode(4)  # the seed's initial capsule restored, the same noise stream
    other = host.run_episode(4, repeat=1)  # the same capsule, noise of its own
    assert (first.reset_kind, again.reset_kind, other.reset_kind) == ("cold", "restore", "restore")
    for key in ("action", "policy_action", "value", "state"):
        assert np.array_equal(first.episode.steps[key], again.episode.steps[key], equal_nan=True), key
    n = min(first.meta.length, other.meta.length)
    assert not np.array_equal(first.episode.steps["action"][:n], other.episode.steps["action"][:n])
    assert np.isfinite(first.episode.steps["value"]).any()  # the critic ran
    # mid-episode: a capsule at chunk starts 3 and 6, an exact replay from the first (else ReplayDivergedError)
    result, values = branch_episode(host, 4, steps=(3, 6), branches=2)
    assert [v.step for v in values] == [3, 6] and result.meta.length == first.meta.length
    host.close()


def test_the_prompt_is_capsule_state_and_reaches_infer():
    policy = NoisyPush()
    host = _host(policy)
    host.run_episode(1)
    assert policy.seen_prompts and all(p == host.env.instruction for p in policy.seen_prompts if p is not None)
    wrapped = host.policy
    wrapped.set_language("push the puck onto the green disc")
    capsule = host.snapshot()
    wrapped.set_language("something else")
    from capsule_rollout.capsules import restore

    restore(host.arena, capsule)
    assert wrapped.prompt == "push the puck onto the green disc"
    with pytest.raises(ValueError, match="capsule holds 1024"):
        wrapped.set_language("x" * 1025)
    host.close()


def test_unfit_objects_are_refused_with_the_reason():
    env = make_env(ENV, cameras=())

    class Unseeded:
        def infer(self, obs):
            return np.random.uniform(-1, 1, (4, 2))

    with pytest.raises(ValueError, match="takes no `noise` keyword.*deterministic=True"):
        as_rollout_policy(Unseeded(), env, chunk_length=4)
    policy = as_rollout_policy(Deterministic(), env)  # declared; its chunk length probed on a zero observation
    assert isinstance(policy, InferPolicy) and policy.spec.chunk_length == 3 and policy.spec.action_dim == 2
    with pytest.raises(ValueError, match="give chunk_length"):
        as_rollout_policy(type("NoLength", (), {"infer": lambda self, obs, *, noise: None})(), env)
    with pytest.raises(ValueError, match="give chunk_length"):
        as_rollout_policy(torch.nn.Linear(6, 2), env)
    with pytest.raises(ContractError, match=r"object.infer is missing: a policy answers infer\(obs, \*, noise\)"):
        as_rollout_policy(object(), env)
    with pytest.raises(ContractError, match=r"object.value is missing: a critic answers value\(obs\) -> float"):
        as_rollout_critic(object(), env)
    with pytest.raises(ValueError, match=r"reads observation key\(s\) \['image_top'\]"):
        as_rollout_policy(NoisyPush(), env, observation_keys=("state", "image_top"))

    class WrongShape(NoisyPush):
        def infer(self, obs, *, noise):
            return {"actions": np.zeros((5, 2))}

    host = RolloutHost(env=env, policy=as_rollout_policy(WrongShape(), env), critic=None, config=HostConfig(n_exec=3))
    result = host.run_episode(0)
    assert result.episode is None and "answered a chunk of shape (5, 2); this policy acts with (6, 2)" in result.error
    host.close()


def test_sources_are_told_apart():
    assert source_kind("examples.own_env_and_policy:make_policy") == "factory"
    assert source_kind("capsule_rollout/checkpoints/policy") == "checkpoint"


def test_checkpoints_load_through_the_loader_their_kind_registers(tmp_path):
    """The core names no checkpoint kind of the example: the flow policy and value critic come from the
    entry points the tabletop package registers; an unknown kind says what to install."""
    import json
    import shutil

    from capsule_rollout.cli.paths import resolve_input
    from capsule_rollout.rollout.sources import describe_source, loader_for

    policy = describe_source(resolve_input("checkpoints/policy"))
    assert policy.takes_conditioning and policy.takes_noise_scale and policy.chunk_length >= 1
    assert type(loader_for(resolve_input("checkpoints/critic"))).__module__ == "capsule_rollout.tabletop.loaders"
    shutil.copytree(resolve_input("checkpoints/critic"), tmp_path / "odd")
    meta = json.loads((tmp_path / "odd" / "checkpoint.json").read_text())
    (tmp_path / "odd" / "checkpoint.json").write_text(json.dumps({**meta, "kind": "diffusion_transformer"}))
    with pytest.raises(ValueError, match="no loader is registered for that kind.*capsule_rollout.checkpoints"):
        loader_for(str(tmp_path / "odd"))
    with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
        loader_for(str(tmp_path))
