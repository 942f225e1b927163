"""The functions a CUDA graph captures (`PolicyRuntime._act`, `CriticRuntime._evaluate`) checked without a GPU.

A captured function must not make the host wait for the device (`.item()`,
`nonzero`, a boolean test of a tensor, ...: an error during capture, a stall per
chunk otherwise) and must keep every tensor on the runtime's device. Each function
runs here as `GraphRunner` calls it, over its bound buffers, under a dispatch
mode that records every aten op: on the CPU, and on `meta`, where no tensor has
data (any op that needs a value fails) and every op must stay on the device (a
tensor made on the CPU inside the function would show up, as it would break a
CUDA capture).
"""

import copy
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from capsule_rollout.capsules import Arena
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.flow_policy import FlowPolicy
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from capsule_rollout.tabletop.value_critic import ValueCritic
from tests.policies.tiny import TINY_CRITIC, TINY_POLICY

# aten ops that copy a device value to the host, or whose output shape depends on data
HOST_SYNC_OPS = {
    "aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::masked_select",
    "aten::equal", "aten::allclose", "aten::unique_dim", "aten::_unique2", "aten::unique_consecutive",
    "aten::repeat_interleave", "aten::bincount", "aten::histc", "aten::_assert_async", "aten::tolist",
}


class OpRecorder(TorchDispatchMode):
    """Records each aten op and the devices of the tensors it reads and makes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, set[str]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten((args, kwargs, out))
        devices = {str(t.device) for t in flat if isinstance(t, torch.Tensor)}
        self.ops.append((func._schema.name, devices))
        return out

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.ops}


def _policy(guidance: bool) -> PolicyRuntime:
    torch.manual_seed(0)
    runtime = PolicyRuntime(FlowPolicy(TINY_POLICY), seed=5, guidance=guidance, trace=False)
    Arena([runtime]).allocate()
    runtime.set_language("pick up the red block")
    runtime.set_conditioning(1, beta=1.5 if guidance else None)
    return runtime


def _critic(**changes) -> CriticRuntime:
    torch.manual_seed(0)
    runtime = CriticRuntime(ValueCritic(dataclasses.replace(TINY_CRITIC, **changes)), trace=False)
    Arena([runtime]).allocate()
    runtime.set_language("pick up the red block")
    return runtime


RUNTIMES = {
    "policy": lambda: _policy(guidance=False),
    "policy_guided": lambda: _policy(guidance=True),
    "critic": lambda: _critic(),
    "critic_actor_plan": lambda: _critic(actor_input=True, plan_steps=2),
}


def _captured(runtime):
    """The function the runtime's GraphRunner captures."""
    assert runtime.runner.fn == (runtime._act if isinstance(runtime, PolicyRuntime) else runtime._evaluate)
    return runtime.runner.fn


def _moved(runtime, convert):
    """A copy of `runtime` whose buffers and network are `convert`ed (to meta)."""
    moved = copy.copy(runtime)
    moved.buffers = {k: convert(v) for k, v in runtime.buffers.items()}
    moved.core = copy.deepcopy(runtime.core)
    for module in moved.core.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(convert(p.detach()), requires_grad=False)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = convert(b)
    return moved


@pytest.mark.parametrize("kind", sorted(RUNTIMES))
def test_captured_function_makes_no_host_sync(kind):
    runtime = RUNTIMES[kind]()
    fn = _captured(runtime)
    recorder = OpRecorder()
    with torch.no_grad(), recorder:
        fn()
    assert len(recorder.ops) > 20  # the whole network ran under the mode
    assert not recorder.names & HOST_SYNC_OPS, sorted(recorder.names & HOST_SYNC_OPS)


def test_the_recorder_sees_a_host_sync():
    recorder = OpRecorder()
    with recorder:
        x = torch.ones(3)
        if x.sum() > 0:  # a boolean test of a tensor: the host reads its value
            pass
    assert recorder.names & HOST_SYNC_OPS


@pytest.mark.parametrize("kind", sorted(RUNTIMES))
def test_captured_function_runs_on_meta(kind):
    runtime = _moved(RUNTIMES[kind](), lambda t: t.to("meta"))
    recorder = OpRecorder()
    with torch.no_grad(), recorder:
        _captured_on(runtime)()
    out = runtime.buffers["chunk" if isinstance(runtime, PolicyRuntime) else "value"]
    assert out.device.type == "meta"
    assert {d for _, devices in recorder.ops for d in devices} == {"meta"}


def _captured_on(moved):
    """The captured function bound to the moved copy (the same code as `_captured`)."""
    return (PolicyRuntime._act if isinstance(moved, PolicyRuntime) else CriticRuntime._evaluate).__get__(moved)


def test_the_meta_run_sees_a_tensor_made_on_the_cpu():
    recorder = OpRecorder()
    with torch.no_grad(), recorder:
        x = torch.ones(2, device="meta")
        y = x * torch.tensor(2.0)  # a 0-dim CPU tensor mixes in silently; the recorder sees it
    assert y.device.type == "meta"
    assert {d for _, devices in recorder.ops for d in devices} != {"meta"}
