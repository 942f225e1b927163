"""Policy and critic on CUDA: captured graphs, two lanes, no host syncs in replays (needs a GPU)."""

import pytest
import torch

from capsule_rollout.capsules import Arena, restore, snapshot
from capsule_rollout.policies.execution_context import TwoLaneContext
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from tests.policies.tiny import obs_of, tiny_critic, tiny_policy

pytestmark = pytest.mark.gpu


def _pair(device: str, *, capture: bool | None = None, seed: int = 3):
    pol = PolicyRuntime(tiny_policy(), device=device, seed=seed, capture=capture)
    cri = CriticRuntime(tiny_critic(), device=device, capture=capture)
    arena = Arena([pol, cri]).allocate()
    g = torch.Generator().manual_seed(0)
    image = {"front": torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8, generator=g)}
    state = torch.randn(8, generator=g)
    for rt in (pol, cri):
        rt.set_language("pick up the green block")
    pol.load_observation(obs_of(image, state))
    cri.load_observation(obs_of(image, state), step=17)
    return pol, cri, arena


def test_two_lanes_on_cuda_give_the_serial_and_the_eager_results():
    pol, cri, arena = _pair("cuda")
    eager_pol, eager_cri, _ = _pair("cuda", capture=False)
    assert pol.runner.mode == "cuda_graph" and eager_pol.runner.mode == "eager"
    capsule = snapshot(arena)
    ctx = TwoLaneContext("cuda")
    try:
        ctx.serial(pol.runner, cri.runner)
        serial = (pol.buffers["chunk"].clone(), cri.buffers["value"].clone())
        pol.buffers["chunk"].zero_()
        cri.buffers["value"].zero_()
        restore(arena, capsule)
        ctx.run(pol.runner, cri.runner)
        assert torch.equal(pol.buffers["chunk"], serial[0]) and torch.equal(cri.buffers["value"], serial[1])
        assert not torch.equal(serial[0], torch.zeros_like(serial[0]))
        eager_pol.runner()
        eager_cri.runner()
        torch.cuda.synchronize()
        assert torch.equal(eager_pol.buffers["chunk"], serial[0]) and torch.equal(eager_cri.buffers["value"], serial[1])
    finally:
        ctx.close()


def test_replays_make_no_host_sync():
    pol, cri, _ = _pair("cuda")
    ctx = TwoLaneContext("cuda")
    ctx.run(pol.runner, cri.runner)  # warm-up and capture synchronise; replays must not
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(ctx.streams[0]):
            for _ in range(5):
                pol.runner()
        with torch.cuda.stream(ctx.streams[1]):
            for _ in range(5):
                cri.runner()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    assert pol.buffers["rng"].tolist() == [3, 6]  # the counter bumped inside each replay


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_runtimes_on_the_second_gpu_with_the_first_current():
    torch.cuda.set_device(0)
    pol, cri, arena = _pair("cuda:1")
    eager_pol, _, _ = _pair("cuda:1", capture=False)
    ctx = TwoLaneContext("cuda:1")
    try:
        chunks = []
        for _ in range(2):
            ctx.run(pol.runner, cri.runner)
            chunks.append(pol.buffers["chunk"].clone())
        for want in chunks:
            eager_pol.runner()
            assert torch.equal(eager_pol.buffers["chunk"], want)
        assert torch.cuda.current_device() == 0
        assert arena.buffer("policy/chunk").device == torch.device("cuda:1")
    finally:
        ctx.close()
