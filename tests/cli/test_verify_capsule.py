import json

from capsule_rollout.capsules.reference_components import NoisyChunkSteppable
from capsule_rollout.cli import verify_capsule
from capsule_rollout.cli.run import main


def test_report_is_all_bit_exact_with_the_documented_fields(tmp_path):
    out = tmp_path / "verify.json"
    assert main(["verify_capsule", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["all_bit_exact"] is True
    names = [c["name"] for c in data["components"]]
    assert len(names) >= 7 and "env/pick_place[front+top]" in names and "env/sort[front+top]" in names
    for comp in data["components"]:
        assert {"name", "bit_exact", "max_abs_diff", "cosine", "capsule_bytes"} <= set(comp)
        assert comp["bit_exact"] is True and comp["max_abs_diff"] == 0.0 and comp["cosine"] == 1.0
        assert comp["capsule_bytes"] > 0
    assert data["digest_backends"]["cpu"] == {"backend": "torch", "reason": "the torch digest serves cpu buffers"}


def test_verify_capsule_on_cuda_without_a_gpu_says_so():
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(SystemExit, match="no CUDA device is visible"):
        main(["verify_capsule", "--device", "cuda"])


def test_exit_code_is_non_zero_when_a_component_is_not_exact(tmp_path, monkeypatch):
    class Broken(NoisyChunkSteppable):
        def __init__(self):
            super().__init__()
            self.policy.after_restore = lambda: None

    original = verify_capsule.targets
    monkeypatch.setattr(verify_capsule, "targets", lambda config: original(config) + [Broken])
    out = tmp_path / "verify.json"
    assert main(["verify_capsule", "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["all_bit_exact"] is False
    assert [c["bit_exact"] for c in data["components"]].count(False) == 1
