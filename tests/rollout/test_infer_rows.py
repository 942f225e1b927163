"""One `infer` object (and one `value` object) per actor: a policy that batches serves every slot with one call
over the rows, episodes as they are in a host of one slot; one that does not gets an instance per slot."""

from __future__ import annotations

import numpy as np
import pytest

from capsule_rollout.critics.infer_critic_rows import InferCriticRows
from capsule_rollout.policies.infer_policy_rows import InferPolicyRows
from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.slots.host import LoopRows, episode_job
from tests.rollout.test_plug_in import Distance, NoisyPush
from tests.rollout.test_slots import same_episode

ENV = "examples.own_env_and_policy:make_env"
MADE: dict[str, int] = {}


class BatchPush(NoisyPush):
    """`NoisyPush` over N rows in one call; each row computed as `NoisyPush.infer` computes one."""

    calls = 0

    def infer_batch(self, obs, *, noise):
        BatchPush.calls += 1
        assert obs["state"].ndim == 2 and noise.shape[0] == obs["state"].shape[0] == len(obs["prompt"])
        return {"actions": np.stack([self.infer({"state": s}, noise=n)["actions"]
                                     for s, n in zip(obs["state"], noise)])}


class BatchDistance(Distance):
    batches = True  # `value` takes the rows

    def value(self, obs):
        if obs["state"].ndim == 1:
            return super().value(obs)
        return np.array([super(BatchDistance, self).value({"state": s, "step": t})
                         for s, t in zip(obs["state"], obs["step"])])


class Broken(BatchPush):
    def infer_batch(self, obs, *, noise):
        out = super().infer_batch(obs, noise=noise)["actions"]
        out[:, 0, 0] = np.nan
        return out


def _made(name: str, obj):
    MADE[name] = MADE.get(name, 0) + 1
    return obj


def batch_push():
    return _made("batch_push", BatchPush())


def batch_distance():
    return _made("batch_distance", BatchDistance())


def noisy_push():
    return _made("noisy_push", NoisyPush())


def distance():
    return _made("distance", Distance())


def broken():
    return Broken()


def _spec(policy: str, critic: str, slots: int) -> RunSpec:
    return RunSpec(env=ENV, policy=f"{__name__}:{policy}", critic=f"{__name__}:{critic}", slots=slots,
                    host=HostConfig(n_exec=3, max_steps=24))


def test_one_batching_object_serves_every_slot_and_plays_the_episodes_one_slot_plays():
    MADE.clear()
    slots = build_slots(_spec("batch_push", "batch_distance", 4))
    try:
        assert MADE == {"batch_push": 1, "batch_distance": 1}  # one instance of each per actor
        assert isinstance(slots.policy_rows, InferPolicyRows) and isinstance(slots.critic_rows, InferCriticRows)
        calls = BatchPush.calls
        results = slots.run_items([episode_job(s) for s in range(10, 18)])
        assert [r.error for r in results] == [None] * 8 and {r.slot for r in results} == {0, 1, 2, 3}
        assert BatchPush.calls - calls == slots.calls  # one call of the object per round, whatever the rows
        assert slots.rows_served > slots.calls  # rows were served together
    finally:
        slots.close()
    alone = build_host(_spec("batch_push", "batch_distance", 1))
    try:
        for r in results:
            played = alone.run_episode(10 + r.index)
            same_episode(played.episode, r.value.episode, same_capsule=False)
            assert np.isfinite(played.episode.steps["value"]).any()
    finally:
        alone.close()


def test_an_object_that_does_not_batch_gets_an_instance_per_slot():
    MADE.clear()
    slots = build_slots(_spec("noisy_push", "distance", 3))
    try:
        assert MADE == {"noisy_push": 3, "distance": 3}
        assert isinstance(slots.policy_rows, LoopRows) and isinstance(slots.critic_rows, LoopRows)
        results = slots.run_items([episode_job(s) for s in range(3)])
        assert [r.error for r in results] == [None] * 3
    finally:
        slots.close()


def test_non_finite_actions_from_a_batch_end_the_episode_naming_the_method():
    slots = build_slots(_spec("broken", "batch_distance", 2))
    try:
        results = slots.run_items([episode_job(s) for s in range(2)])
        for r in results:
            assert r.error is None and isinstance(r.value.exception, ValueError)
            assert "Broken.infer_batch answered non-finite actions" in r.value.error
            assert r.value.episode is None or not np.isnan(r.value.episode.steps["action"]).any()  # none reached the env
    finally:
        slots.close()


@pytest.mark.parametrize("answer", [np.zeros((4, 6, 2)), np.zeros((2, 5, 2)), {"nope": 1}])
def test_a_batch_of_the_wrong_shape_is_refused_naming_the_object(answer):
    from capsule_rollout.envs.suites import make_env
    from capsule_rollout.rollout.sources import as_rollout_policy

    class Wrong(BatchPush):
        def infer_batch(self, obs, *, noise):
            return answer

    env = make_env(ENV, cameras=())
    rows = as_rollout_policy(Wrong(), env).batched(2)
    env.reset(seed=0)
    for i in range(2):
        rows.slot(i).reset(i)
        rows.slot(i).load_observation(env.observe())
    with pytest.raises(ValueError, match="Wrong.infer_batch answered"):
        rows.act_rows([0, 1])
    env.close()


class StateOnly(NoisyPush):
    observation_keys = ("state",)


def state_only():
    return StateOnly()


def test_the_env_renders_only_the_cameras_the_policy_and_critic_read():
    says = build_host(_spec("state_only", "distance", 1).__class__(env=ENV, policy=f"{__name__}:state_only",
                                                                    host=HostConfig(n_exec=3, max_steps=6)))
    reads_all = build_host(_spec("noisy_push", "distance", 1))
    try:
        assert [k for k in says.env.observation_spec.arrays if k.startswith("image_")] == []
        assert [k for k in reads_all.env.observation_spec.arrays if k.startswith("image_")] == ["image_free"]
        assert "image_free" not in says.run_episode(0).episode.steps
    finally:
        says.close()
        reads_all.close()


def test_the_run_summary_says_how_many_objects_each_actor_holds(tmp_path, capsys):
    from capsule_rollout.cli.run import main

    summary = tmp_path / "s.json"
    assert main(["sim_rollout", "--env", ENV, "--policy", f"{__name__}:batch_push", "--critic",
                 f"{__name__}:distance", "--actors", "0", "--slots", "2", "--episodes", "4", "--max_steps", "9",
                 "--n_exec", "3", "--out", str(tmp_path / "run"), "--no-progress", "--video", "false",
                 "--json", str(summary)]) == 0
    import json

    data = json.loads(summary.read_text())
    assert data["instances_by_actor"] == {"0": {"policy": 1, "critic": 2, "slots": 2}}  # the critic does not batch
    out = capsys.readouterr().out
    assert "policy / critic instances" in out and "1 / 2" in out
