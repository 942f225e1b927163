"""A rollout host with policy and critic on CUDA (needs a GPU): restores reuse everything in place."""

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import restore, verify_steppable
from capsule_rollout.rollout.host_factory import RunSpec, build_host
from capsule_rollout.rollout.rollout_host import HostConfig, capsule_key
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.tabletop.rollout_steppable import RolloutSteppable
from tests.policies.tiny import save_tiny_checkpoints, tiny_critic, tiny_policy

pytestmark = pytest.mark.gpu
SEED = 1_000_123


@pytest.fixture
def host(tmp_path):
    policy, critic = save_tiny_checkpoints(tmp_path)
    host = build_host(RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, device="cuda",
                               host=HostConfig(n_exec=4, max_steps=12)))
    yield host
    host.close()


def test_an_episode_restored_gives_identical_actions(host):
    first = host.run_episode(SEED)
    again = host.run_episode(SEED)
    assert (first.reset_kind, again.reset_kind) == ("cold", "restore")
    assert host.policy.runner.mode == "cuda_graph" and host.policy.runner.graph is not None
    for key in (S.ACTION, S.POLICY_ACTION, S.VALUE, S.STATE):
        a, b = first.episode.steps[key], again.episode.steps[key]
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), key


def test_100_restores_keep_addresses_graphs_and_memory(host):
    host.run_episode(SEED)  # cold reset, warm-up and capture
    capsule = host.store.get(capsule_key(host.task, SEED))
    lanes, pol, cri = host.lanes, host.policy, host.critic
    restore(host.arena, capsule)
    lanes.run(pol.runner, cri.runner)
    want = pol.buffers["chunk"].clone()
    addresses = [slab.data_ptr() for _, slab in host.arena.slabs()]
    graphs = (pol.runner.graph, cri.runner.graph)
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for _ in range(100):
        restore(host.arena, capsule)
        lanes.run(pol.runner, cri.runner)
        assert torch.equal(pol.buffers["chunk"], want)
    torch.cuda.synchronize()
    assert [slab.data_ptr() for _, slab in host.arena.slabs()] == addresses
    assert pol.runner.graph is graphs[0] and cri.runner.graph is graphs[1]
    assert torch.cuda.memory_allocated() == allocated


def test_the_whole_rollout_boundary_is_bit_exact_on_cuda():
    report = verify_steppable(lambda: RolloutSteppable(tiny_policy(), tiny_critic(), device="cuda"))
    assert report.bit_exact, report.failures
    assert report.device == "cpu+cuda"  # the env's state stays on the CPU
