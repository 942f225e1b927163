"""The CUDA path of `GraphRunner` and `TwoLaneContext`, in order, on a fake `torch.cuda` (no GPU needed).

The policy and critic runtimes are built as usual; their runners are made by their
own `bind`, for a fake `cuda:1` while `cuda:0` is current (the multi-GPU case), and
their captured functions launch as work on `cuda:1` (see `tests/fake_cuda.py`).
The real work runs on the CPU when the fake CUDA runs a kernel, so the chunks can be
compared with an eager runtime's: a wrong warm-up, capture or replay shows in the
numbers as well as in the order of calls.
"""

import numpy as np
import pytest
import torch

import capsule_rollout.models.runtime as model_runtime
from capsule_rollout.capsules import Arena
from capsule_rollout.models.graph_runner import GraphRunner
from capsule_rollout.policies.execution_context import TwoLaneContext
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from tests.fake_cuda import FakeCuda
from tests.policies.tiny import obs_of, tiny_critic, tiny_policy

DEVICE = 1  # the runtimes' device; device 0 is current
WARMUP = 3
SEED = 7


def _observation():
    rng = np.random.default_rng(0)
    return {"front": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)}, rng.normal(size=8).astype(np.float32)


def _load(pol: PolicyRuntime, cri: CriticRuntime) -> None:
    images, state = _observation()
    for runtime in (pol, cri):
        runtime.set_language("pick up the green block")
    pol.load_observation(obs_of(images, state))
    cri.load_observation(obs_of(images, state), step=12)


@pytest.fixture(scope="module")
def reference() -> tuple[list[torch.Tensor], torch.Tensor]:
    """What eager runtimes on the CPU give (made before any fake): three successive chunks (noise
    counter 0, 1, 2) and the value."""
    pol, cri = PolicyRuntime(tiny_policy(), seed=SEED, trace=False), CriticRuntime(tiny_critic(), trace=False)
    Arena([pol, cri]).allocate()
    _load(pol, cri)
    assert pol.runner.mode == "eager"
    return [pol.act().clone() for _ in range(3)], cri.evaluate().clone()


@pytest.fixture
def fake(monkeypatch) -> FakeCuda:
    cuda = FakeCuda(monkeypatch)

    def runner(fn, device, *, capture=None, **kwargs):
        """The runtime's own GraphRunner arguments, on the fake device with its function as cuda:1 work."""
        assert device.type == "cpu" and capture is None  # the runtimes below are built as on the CPU
        return GraphRunner(cuda.kernel(fn, DEVICE, fn.__qualname__), f"cuda:{DEVICE}", warmup=WARMUP, **kwargs)

    monkeypatch.setattr(model_runtime, "GraphRunner", runner)  # the runtimes' shared base makes the runners
    return cuda


def _runtimes() -> tuple[PolicyRuntime, CriticRuntime]:
    pol, cri = PolicyRuntime(tiny_policy(), seed=SEED, trace=False), CriticRuntime(tiny_critic(), trace=False)
    Arena([pol, cri]).allocate()
    _load(pol, cri)
    return pol, cri


def _launches(fake: FakeCuda, kernel: str, how: str | None = None) -> list[tuple]:
    return [e for e in fake.entries("launch") if e[1] == kernel and (how is None or e[4] == how)]


def test_two_lanes_capture_once_on_their_device_and_replay_the_eager_results(reference, fake):
    pol, cri = _runtimes()
    ctx = TwoLaneContext(f"cuda:{DEVICE}")
    chunks, values = [], []
    for _ in range(3):
        ctx.run(pol.runner, cri.runner)
        chunks.append(pol.buffers["chunk"].clone())
        values.append(cri.buffers["value"].clone())
    want_chunks, want_value = reference
    # warm-up advanced the noise counter; it was put back, so the first replay drew counter 0
    for got, want in zip(chunks, want_chunks):
        assert torch.equal(got, want)
    assert not torch.equal(chunks[0], chunks[1])  # each replay bumps the counter inside the graph
    assert all(torch.equal(v, want_value) for v in values)
    assert pol.buffers["rng"].tolist() == [SEED, 3]
    # each runner captured exactly once: one graph, one capture, its one function recorded
    assert len(fake.graphs) == 2 and len(fake.entries("capture_begin")) == 2
    for kernel in ("PolicyRuntime._act", "CriticRuntime._evaluate"):
        assert len(_launches(fake, kernel, "captured")) == 1
        assert len(_launches(fake, kernel, "run")) == WARMUP  # warm-up only; never run eagerly after
        assert len(_launches(fake, kernel, "replay")) == 3


def test_capture_and_warm_up_use_streams_of_the_runners_device(fake):
    # another runner of the process captured on cuda:0 first (torch's shared capture stream, if used,
    # would now belong to cuda:0)
    other = torch.zeros(1)
    GraphRunner(fake.kernel(lambda: other.add_(1), 0, "other"), "cuda:0")()
    pol, cri = _runtimes()
    ctx = TwoLaneContext(f"cuda:{DEVICE}")
    ctx.run(pol.runner, cri.runner)
    lanes = {s.name for s in ctx.streams}
    made = {name: device for _, name, device in fake.entries("new_stream")}
    for _, graph, device, stream in fake.entries("capture_begin")[1:]:
        assert device == DEVICE and made.get(stream) == DEVICE, (graph, device, stream)
        assert stream not in lanes  # a capture stream of the runner, not a lane
    for kernel in ("PolicyRuntime._act", "CriticRuntime._evaluate"):
        warm = {stream for _, _, _, stream, _ in _launches(fake, kernel, "run")}
        assert len(warm) == 1 and made.get(warm.pop()) == DEVICE and not warm & lanes
    assert fake.current_device == 0  # the caller's device is current again


def test_runner_called_directly_captures_on_its_device_while_another_is_current(reference, fake):
    pol, cri = _runtimes()
    assert fake.current_device == 0
    chunks = [pol.act().clone() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(chunks, reference[0]))
    (_, _, device, stream), = fake.entries("capture_begin")
    assert device == DEVICE and stream.endswith(f"@{DEVICE}")
    replays = _launches(fake, "PolicyRuntime._act", "replay")
    assert [(d, s) for _, _, d, s, _ in replays] == [(DEVICE, f"default@{DEVICE}")] * 2


def test_warm_up_runs_before_the_capture_and_leaves_no_trace(fake):
    pol, _ = _runtimes()
    pol.runner()
    log = fake.log
    warm = [i for i, e in enumerate(log) if e[:2] == ("launch", "PolicyRuntime._act") and e[4] == "run"]
    (capture,) = [i for i, e in enumerate(log) if e[0] == "capture_begin"]
    (replay,) = [i for i, e in enumerate(log) if e[0] == "replay"]
    assert len(warm) == WARMUP and max(warm) < capture < replay
    # the side stream waited for the caller's stream before warming up, and the caller for it after
    side = log[warm[0]][3]
    assert log.index(("wait_stream", side, "default@1")) < warm[0]
    assert max(warm) < log.index(("wait_stream", "default@1", side)) < capture
    assert pol.buffers["rng"].tolist() == [SEED, 1]  # three warm-ups and the capture left no trace; one replay


def test_lanes_wait_for_the_host_and_the_host_reads_after_both_joined(fake):
    pol, cri = _runtimes()
    ctx = TwoLaneContext(f"cuda:{DEVICE}")
    ctx.run(pol.runner, cri.runner)  # first run: warm-up and capture
    fake.log.clear()
    ctx.run(pol.runner, cri.runner)
    fake.log.append(("read",))  # the host reads the outputs once run() returned
    log, host = fake.log, f"default@{DEVICE}"
    (p_lane, c_lane) = (s.name for s in ctx.streams)
    ready = next(e for e in log if e[0] == "record" and e[2] == host)
    at = log.index
    for lane, kernel in ((p_lane, "PolicyRuntime._act"), (c_lane, "CriticRuntime._evaluate")):
        wait = ("wait_event", lane, ready[1])
        (launch,) = _launches(fake, kernel)
        assert launch[2:] == (DEVICE, lane, "replay")  # replayed on its lane
        done = next(e for e in log if e[0] == "record" and e[2] == lane)
        join = ("wait_event", host, done[1])
        assert at(ready) < at(wait) < at(launch) < at(done) < at(join) < at(("synchronize", DEVICE)) < at(("read",))
    assert not any(e[0] == "launch" and e[4] != "replay" for e in log)  # nothing ran outside the graphs
    assert not fake.entries("capture_begin")  # no re-capture
