import json

from capsule_rollout.experiments.run import main


def test_quick_bench_env_reports_every_measure(tmp_path):
    out, docs = tmp_path / "b.json", tmp_path / "B.md"
    assert main(["bench_env", "--quick", "--json", str(out), "--docs", str(docs)]) == 0
    data = json.loads(out.read_text())
    assert set(data["stepping"]) == {"state_only", "rendered_64px"}
    assert all(v > 0 for v in data["stepping"].values())
    assert data["reset"]["reset_seed"]["median"] > 0 and data["reset"]["restore"]["median"] > 0
    for rec in ("npz", "zarr"):
        assert data["recorders"][rec]["mb_s"] > 0 and data["recorders"][rec]["caller_us_per_step"] > 0
    assert "<!-- bench_env:begin -->" in docs.read_text()
