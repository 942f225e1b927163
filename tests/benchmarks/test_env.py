import json

from benchmarks.env import main


def test_quick_bench_env_reports_every_measure(tmp_path):
    out, docs = tmp_path / "b.json", tmp_path / "B.md"
    assert main(["--quick", "--json", str(out), "--docs", str(docs)]) == 0
    data = json.loads(out.read_text())
    assert set(data["stepping"]) == {"state_only", "rendered_64px"}
    assert all(v > 0 for v in data["stepping"].values())
    assert data["reset"]["reset_seed"]["median"] > 0 and data["reset"]["restore"]["median"] > 0
    for rec in ("npz", "zarr"):
        assert data["recorders"][rec]["mb_s"] > 0 and data["recorders"][rec]["caller_us_per_step"] > 0
    assert "<!-- bench_env:begin -->" in docs.read_text()


def test_a_registered_suite_env_and_a_bad_id(tmp_path, capsys):
    """`--env`: a suite env through the capsule adapter, in a section of its own; a mistyped id is refused."""
    docs = tmp_path / "B.md"
    assert main(["--env", "gymnasium:Reacher-v5", "--quick", "--section", "t", "--docs", str(docs), "--json",
                 str(tmp_path / "b.json")]) == 0
    bench = json.loads((tmp_path / "b.json").read_text())["suite_envs"][0]
    assert bench["capsule_bytes"] > 0 and bench["restore"]["median"] > 0
    assert "_t:begin -->" in docs.read_text() and "| `gymnasium:Reacher-v5` |" in docs.read_text()
    assert main(["--env", "gymnasium:Reachr-v5"]) == 2
    assert "did you mean Reacher-v5" in capsys.readouterr().err
