import torch

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.policies.execution_context import TwoLaneContext
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from tests.policies.tiny import obs_of, tiny_critic, tiny_policy


def test_two_lanes_give_the_serial_results():
    policy, critic = tiny_policy(), tiny_critic()
    pol, cri = PolicyRuntime(policy, seed=3), CriticRuntime(critic)
    arena = Arena([pol, cri]).allocate()
    g = torch.Generator().manual_seed(0)
    for rt in (pol, cri):
        rt.set_language("pick up the green block")
        step = {"step": 17} if rt is cri else {}  # the critic also reads the episode step
        rt.load_observation(obs_of({"front": torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, generator=g)},
                                   torch.randn(8, generator=g)), **step)
    capsule = snapshot(arena)  # state: noise counter and subtask embeddings
    ctx = TwoLaneContext("cpu")
    try:
        ctx.serial(pol.runner, cri.runner)
        serial = (pol.buffers["chunk"].clone(), cri.buffers["value"].clone())
        pol.buffers["chunk"].zero_()
        cri.buffers["value"].zero_()
        restore(arena, capsule)  # same state; the observation slots still hold the same inputs
        ctx.run(pol.runner, cri.runner)
        assert torch.equal(pol.buffers["chunk"], serial[0]) and torch.equal(cri.buffers["value"], serial[1])
        assert not torch.equal(serial[0], torch.zeros_like(serial[0]))
    finally:
        ctx.close()


def test_a_failing_lane_still_joins_and_raises():
    ctx = TwoLaneContext("cpu")
    ran = []
    try:
        def critic():
            ran.append("critic")
            raise RuntimeError("critic lane broke")

        import pytest

        with pytest.raises(RuntimeError, match="critic lane broke"):
            ctx.run(lambda: ran.append("policy"), critic)
        assert sorted(ran) == ["critic", "policy"]
    finally:
        ctx.close()
