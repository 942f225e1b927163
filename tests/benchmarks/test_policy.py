"""The policy benchmark compares what it says it compares."""

import torch

import benchmarks.policy as bench_policy
from capsule_rollout.models.graph_runner import GraphRunner
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime
from tests.fake_cuda import FakeCuda
from tests.policies.tiny import tiny_critic, tiny_policy


def test_the_eager_policy_is_not_captured_on_cuda(monkeypatch):
    """On a GPU the runtimes capture by default; the 'eager' row must opt out of capture as well as tracing."""
    FakeCuda(monkeypatch)  # TwoLaneContext and timing on a fake cuda
    modes = {}

    def runtime_as_on_cuda(model, *, device, name="policy", **kwargs):
        assert torch.device(device).type == "cuda"
        # the mode this runtime's GraphRunner takes on `device`; the runtime itself runs on the CPU here
        modes[name] = GraphRunner(lambda: None, device, capture=kwargs.get("capture")).mode
        kwargs.pop("capture", None)
        return PolicyRuntime(model, device="cpu", name=name, **kwargs)

    monkeypatch.setattr(bench_policy, "PolicyRuntime", runtime_as_on_cuda)
    monkeypatch.setattr(bench_policy, "CriticRuntime", lambda model, *, device, **kwargs: CriticRuntime(model, **kwargs))
    out = bench_policy.lanes(tiny_policy(), tiny_critic(), torch.device("cuda"), rounds=3)
    assert modes == {"policy": "cuda_graph", "policy_eager": "eager"}
    assert out["policy_eager"]["n"] == 3 and out["eager_mode"] == "eager"


def test_docs_section_is_written(tmp_path):
    """`--docs` renders the measured summary into its section (the renderer reads every key it prints)."""
    docs = tmp_path / "BENCHMARKS.md"
    assert bench_policy.main(["--quick", "true", "--device", "cpu", "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert "<!-- bench_policy:begin -->" in text and "<!-- bench_policy:end -->" in text
    assert "Euler steps, chunk of " in text and "CUDA graph vs eager: not measured" in text
