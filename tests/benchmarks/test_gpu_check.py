"""gpu_check without a GPU: it refuses at once; its plan, step runner and report are checked here."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import capsules, gpu_check, policy
from benchmarks.gpu_check import GpuCheckConfig, main
from capsule_rollout.cli.run import parse
from capsule_rollout.commands.option_parsing import parse_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_stops_at_once_without_cuda(tmp_path):
    out = tmp_path / "gpu"
    with pytest.raises(SystemExit, match=r"torch sees no CUDA device .*`make gpu-check`"):
        main(["--out", str(out)])
    assert not out.exists()  # nothing ran


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="nvidia-smi is present")
def test_make_gpu_check_stops_before_installing_anything_without_a_gpu():
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    # run as its own make, not as a sub-make of `make test` (which would print "Entering directory")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    dry = subprocess.run([make, "--no-print-directory", "-n", "gpu-check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert dry.stdout.splitlines()[0].startswith("nvidia-smi -L")  # the GPU check comes before any install
    proc = subprocess.run([make, "--no-print-directory", "-s", "gpu-present"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no NVIDIA GPU here" in proc.stderr


def test_plan_runs_every_check_on_cuda_with_valid_options(tmp_path):
    steps = gpu_check.plan(GpuCheckConfig(episodes=3, rounds=7), tmp_path)
    assert [s.name for s in steps] == ["gpu_tests", "verify_capsule", "bench_capsules", "bench_policy", "sim_rollout",
                                       "gpu_slots"]
    by_name = {s.name: s for s in steps}
    assert by_name["gpu_tests"].argv[1:5] == ("-m", "pytest", "-m", "gpu")
    slots = by_name["gpu_slots"]  # a benchmark of its own (argparse): it exists and writes where the step reads
    assert slots.argv[1:3] == ("-m", "benchmarks.gpu_slots") and slots.argv[-2:] == ("--out", str(slots.json))
    assert (ROOT / "benchmarks" / "gpu_slots.py").is_file()
    benchmarks = {"benchmarks.capsules": capsules.BenchCapsulesConfig(), "benchmarks.policy": policy.BenchPolicyConfig()}
    for step in steps[1:-1]:
        if step.argv[2] == "capsule_rollout":  # a command of the package
            name, args = step.argv[3], list(step.argv[4:])
            _, config, json_path = parse(name, args)  # every option exists and is valid
        else:  # a benchmark, run from the repository's root
            name, args = step.argv[2], list(step.argv[3:])
            config, json_path = parse_config(benchmarks[name], args, name, "")
        assert Path(json_path) == step.json and step.json.parent == tmp_path
        if name == "sim_rollout":
            assert (config.actors, config.gpus_per_actor, config.seeds.count) == (2, 0.5, 3)
        else:
            assert config.device == "cuda"
        if name.startswith("benchmarks."):
            assert config.rounds == 7


def test_replay_without_a_store_says_why(tmp_path):
    why = gpu_check.replay_step(tmp_path)
    assert isinstance(why, str) and "wrote no store" in why


def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_each_step_is_recorded_and_a_failure_does_not_stop_the_rest(tmp_path):
    good_json = tmp_path / "good.json"
    good_json.write_text('{"stale": true}')  # an earlier run's summary must not be read as this one's
    steps = [
        gpu_check.Step("broken", _py("import sys; print('lost the device'); sys.exit(3)"), tmp_path / "broken.json"),
        gpu_check.Step("good", _py(f"import json; json.dump({{'exact': True}}, open({str(good_json)!r}, 'w'))"),
                       good_json),
        gpu_check.Step("stuck", _py("import time; time.sleep(60)")),
    ]
    records = [gpu_check.run_step(s, tmp_path, timeout_s=2.0) for s in steps]
    broken, good, stuck = records
    assert (broken["ok"], broken["exit_code"], broken["summary"]) == (False, 3, None)
    assert "lost the device" in broken["tail"]
    assert good["ok"] and good["summary"] == {"exact": True} and "tail" not in good
    assert stuck["timed_out"] and not stuck["ok"] and stuck["seconds"] < 30
    assert all(Path(r["log"]).exists() for r in records)


def test_junit_counts(tmp_path):
    path = tmp_path / "t.xml"
    path.write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"/></testsuites>')
    assert gpu_check.junit_counts(path) == {"tests": 5, "failures": 1, "errors": 0, "skipped": 2, "passed": 2}
    assert gpu_check.junit_counts(tmp_path / "none.xml") is None


def test_markdown_gives_each_figure_or_says_why_it_is_missing():
    mib64 = 64 << 20
    report = {
        "out": "runs/gpu_check",
        "environment": {"devices": ["NVIDIA H100"], "torch": "2.13.0+cu128", "cuda": "12.8", "triton": "3.7.1",
                        "digest_backend": {"backend": "triton", "reason": "ok"}},
        "failed": ["sim_rollout", "replay"],
        "steps": {
            "gpu_tests": {"ok": True, "counts": {"passed": 9, "failures": 0, "errors": 0, "skipped": 2}},
            "bench_policy": {"ok": True, "summary": {"graph": {"speedup": 4.26},
                                                     "lanes": {"16": {"two_lane_over_slower": 1.08}}}},
            "bench_capsules": {"ok": True, "summary": {"sizes": [{"size_bytes": 4096, "restore_over_copy": 9.0},
                                                                 {"size_bytes": mib64, "restore_over_copy": 1.04}]}},
            "verify_capsule": {"ok": True, "summary": {"all_bit_exact": True}},
            "sim_rollout": {"ok": False, "summary": None},
            "replay": {"ok": False, "skipped": "sim_rollout wrote no store"},
        },
    }
    text = gpu_check.markdown(report)
    assert "NVIDIA H100" in text and "9 passed, 0 failed" in text
    assert "| 4.3x faster | >= 3.0x |" in text and "| 1.08x | <= 1.15x |" in text and "| 1.04x | <= 1.2x |" in text
    assert "not measured (step failed, see the report)" in text
    assert "Steps that failed: sim_rollout, replay." in text
    json.dumps(report)  # the report itself is plain JSON


def test_run_writes_one_report_and_judges_each_step(tmp_path, monkeypatch):
    """The whole run with stand-in steps (no GPU here): verdicts, the skipped replay, report and docs section."""
    out, docs = tmp_path / "gpu", tmp_path / "BENCH.md"
    docs.write_text("# Benchmarks\n")
    junit = out / "gpu_tests.xml"
    verify_json = out / "verify_capsule.json"
    monkeypatch.setattr(gpu_check, "require_cuda", lambda: None)
    monkeypatch.setattr(gpu_check, "environment", lambda: {"devices": ["a GPU"], "torch": "t", "cuda": "c"})
    monkeypatch.setattr(gpu_check, "plan", lambda config, out_dir: [
        gpu_check.Step("gpu_tests", _py(f"open({str(junit)!r}, 'w').write('<testsuite tests=\"3\" failures=\"0\" "
                                        f"errors=\"0\" skipped=\"1\"/>')")),
        # exit 0 but not bit-exact: the summary's verdict counts
        gpu_check.Step("verify_capsule", _py(f"import json; json.dump({{'all_bit_exact': False}}, "
                                             f"open({str(verify_json)!r}, 'w'))"), verify_json),
    ])
    assert main(["--out", str(out), "--docs", str(docs)]) == 1
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["steps"]["gpu_tests"]["ok"] and report["steps"]["gpu_tests"]["counts"]["passed"] == 2
    assert not report["steps"]["verify_capsule"]["ok"]
    assert report["steps"]["replay"] == {"name": "replay", "ok": False,
                                         "skipped": f"sim_rollout wrote no store at {out / 'sim_rollout' / 'episodes.zarr'}"}
    assert report["failed"] == ["verify_capsule", "replay"] and report["all_ok"] is False
    text = docs.read_text()
    assert "<!-- gpu_check:begin -->" in text and "2 passed, 0 failed" in text and "a GPU" in text
