"""Every check of the CUDA path in one run (GPU tests, verify, benchmarks, GPU actors, replay); one JSON report.

Needs an NVIDIA GPU; run from the repository's root (`make gpu-check`).

Steps, in order; each but the first runs in its own process, so a crash or a dead
CUDA context in one cannot take the others down, and a failing step is recorded
(exit status, seconds, its JSON summary, the tail of its log) without stopping the rest:

1. `environment`: torch, CUDA and Triton versions, the GPU, the digest backend on CUDA and why;
2. `gpu_tests`: `pytest -m gpu`;
3. `verify_capsule --device cuda`;
4. `benchmarks.capsules --device cuda`; 5. `benchmarks.policy --device cuda`;
6. `sim_rollout --actors 2 --gpus_per_actor 0.5`;
7. `benchmarks.gpu_slots`: the policy and critic rows captured vs eager at 1 to 64 rows, and
   tabletop episodes on 16 one-env processes against fewer processes of several slots (steps/s, GPU memory);
8. `replay` of the first episode that rollout recorded.

`make gpu-check` installs the CUDA build of torch first. Without a CUDA device this
stops at once, before any step.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.report import Table, write_section
from benchmarks.report import markdown as report_markdown
from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.result import ExperimentResult, write_json

ROOT = Path(__file__).resolve().parents[1]  # the repository: where every step runs (its tests, its benchmarks)


@dataclass(frozen=True)
class GpuCheckConfig:
    out: str = "runs/gpu_check"
    """Directory for every step's JSON summary and log, the rollout's episodes and the report (gpu_check.json)."""
    episodes: int = 4
    """sim_rollout episodes (2 actors with half a GPU each); the first one recorded is replayed."""
    rounds: int = 100
    """Timed rounds of the capsules and policy benchmarks."""
    step_timeout_s: float = 1800.0
    """A step still running after this many seconds is stopped and recorded as timed out."""
    docs: str = ""
    """Markdown file whose gpu_check section gets the report's figures (e.g. docs/BENCHMARKS.md); empty: none."""

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.rounds < 3:
            raise ValueError("--episodes must be >= 1 and --rounds >= 3")
        if self.step_timeout_s <= 0:
            raise ValueError(f"--step_timeout_s must be positive, got {self.step_timeout_s}")


# -- the machinery: a step (one command and the JSON summary it writes), run in its own process group with a
# timeout and recorded whatever happens; pytest's junit counts; the CUDA environment
TAIL_CHARS = 4000


@dataclass(frozen=True)
class Step:
    """One check: a command, and the JSON summary it writes (None: none)."""

    name: str
    argv: tuple[str, ...]
    json: Path | None = None


def run_step(step: Step, out: Path, timeout_s: float) -> dict:
    """Run one step in its own process group; its record (never raises for the step's own failure)."""
    log = out / f"{step.name}.log"
    if step.json is not None and step.json.exists():
        step.json.unlink()  # a summary from an earlier run must not pass for this one's
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(step.argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and what it started (Ray's processes)
            proc.wait()
            code = None
    record = {"name": step.name, "command": " ".join(step.argv), "exit_code": code, "timed_out": code is None,
              "seconds": round(time.perf_counter() - t0, 1), "log": str(log), "summary": None}
    if step.json is not None and step.json.exists():
        try:
            record["summary"] = json.loads(step.json.read_text())
        except ValueError as exc:
            record["summary_error"] = f"{step.json}: {exc}"
    record["ok"] = code == 0
    if not record["ok"]:
        text = log.read_text(errors="replace")
        record["tail"] = text[-TAIL_CHARS:]
    return record


def junit_counts(path: Path) -> dict | None:
    """tests / failures / errors / skipped of a pytest junit file (None when there is none)."""
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def environment() -> dict:
    """What this machine runs the checks with (in this process; needs CUDA)."""
    from capsule_rollout.capsules import digest_backend

    info: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                  "capability": list(torch.cuda.get_device_capability(0))}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001 - reported, the digest falls back
        info["triton"] = f"not importable ({type(exc).__name__}: {exc})"
    info["digest_backend"] = digest_backend(torch.device("cuda", 0)).to_json()
    return info


# -- the check: its plan of steps, its report ------------------------------------------------------------
REPORT = "gpu_check.json"
# the goals the GPU figures are judged against (the CUDA path's design targets)
GRAPH_SPEEDUP_GOAL = 3.0
TWO_LANE_GOAL = 1.15
RESTORE_64MIB_GOAL = 1.2
SLOTS_GOAL = 2.0  # steps/s of the best slot layout over one env per process, the same cores
SLOT_LAYOUTS = ("16x1", "4x4x4", "2x8x8", "4x4x1")  # processes x slots x env threads; the first is the baseline


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit(
            f"gpu_check: torch sees no CUDA device (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda or 'none: a CPU build'}). Run `make gpu-check` on a machine with an NVIDIA GPU "
            "and its driver; it installs the CUDA build of torch first."
        )


def plan(config: GpuCheckConfig, out: Path) -> list[Step]:
    """Steps 2-7 (the replay needs the rollout's store, see `replay_step`); each runs in the repository's root."""
    run = (sys.executable, "-m", "capsule_rollout")
    js = {name: out / f"{name}.json" for name in ("verify_capsule", "bench_capsules", "bench_policy", "sim_rollout",
                                                   "gpu_slots")}
    rounds = ("--rounds", str(config.rounds))
    return [
        Step("gpu_tests", (sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                           f"--junitxml={out / 'gpu_tests.xml'}")),
        Step("verify_capsule", (*run, "verify_capsule", "--device", "cuda", "--json", str(js["verify_capsule"])),
             js["verify_capsule"]),
        Step("bench_capsules", (sys.executable, "-m", "benchmarks.capsules", "--device", "cuda", *rounds, "--json",
                                str(js["bench_capsules"])), js["bench_capsules"]),
        Step("bench_policy", (sys.executable, "-m", "benchmarks.policy", "--device", "cuda", *rounds, "--json",
                              str(js["bench_policy"])), js["bench_policy"]),
        Step("sim_rollout", (*run, "sim_rollout", "--actors", "2", "--gpus_per_actor", "0.5", "--seeds.count",
                             str(config.episodes), "--out", str(out / "sim_rollout"), "--video", "false",
                             "--progress", "false", "--json", str(js["sim_rollout"])), js["sim_rollout"]),
        Step("gpu_slots", (sys.executable, "-m", "benchmarks.gpu_slots", "--budget", "330", "--n_exec", "2",
                           "--configs", *SLOT_LAYOUTS, "--out", str(js["gpu_slots"])), js["gpu_slots"]),
    ]


def replay_step(out: Path) -> Step | str:
    """The replay of the rollout's first recorded episode, or why there is none."""
    store = out / "sim_rollout" / "episodes.zarr"
    if not store.exists():
        return f"sim_rollout wrote no store at {store}"
    from capsule_rollout.stores.sharded_reader import open_episode_reader

    ids = open_episode_reader(store).episode_ids
    if not ids:
        return f"{store} holds no episode"
    path = out / "replay.json"
    return Step("replay", (sys.executable, "-m", "capsule_rollout", "replay", "--store", str(store), "--episode",
                           ids[0], "--json", str(path)), path)


def _figure(report: dict, step: str, path: tuple, fmt: str = "{}") -> str:
    """A value from a step's summary, formatted, or why it is missing."""
    rec = report["steps"].get(step)
    value = rec.get("summary") if rec else None
    for key in path:
        if callable(key):
            value = key(value) if value is not None else None
        elif isinstance(value, dict):
            value = value.get(key)
        else:
            value = None
    if value is None:
        return "not measured (step failed, see the report)" if rec and not rec["ok"] else "not measured"
    return fmt.format(value)


def _size(n: int):
    return lambda sizes: next((s for s in sizes if s["size_bytes"] == n), None)


def _lane(lanes: dict):
    return next(iter(lanes.values()), None) if lanes else None


def markdown(report: dict) -> str:
    """The report's figures against the CUDA path's goals, as BENCHMARKS' gpu_check section."""
    env = report.get("environment") or {}
    tests = (report["steps"].get("gpu_tests") or {}).get("counts") or {}
    rows = [
        ("GPU tests (`pytest -m gpu`)", f"{tests.get('passed', '?')} passed, {tests.get('failures', '?')} failed, "
         f"{tests.get('errors', '?')} errors, {tests.get('skipped', '?')} skipped", "all pass"),
        ("captured `act()` vs eager, batch 1", _figure(report, "bench_policy", ("graph", "speedup"), "{:.1f}x faster"),
         f">= {GRAPH_SPEEDUP_GOAL}x"),
        ("policy and critic on two streams / the slower alone",
         _figure(report, "bench_policy", ("lanes", _lane, "two_lane_over_slower"), "{:.2f}x"), f"<= {TWO_LANE_GOAL}x"),
        ("64 MiB device restore / one contiguous device copy",
         _figure(report, "bench_capsules", ("sizes", _size(64 << 20), "restore_over_copy"), "{:.2f}x"),
         f"<= {RESTORE_64MIB_GOAL}x"),
        ("the same, 20 issued back to back (device time, CUDA events)",
         _figure(report, "bench_capsules", ("sizes", _size(64 << 20), "restore_over_copy_back_to_back"), "{:.2f}x"),
         "(the goal is the row above)"),
        ("`verify_capsule --device cuda`: every component bit-exact",
         _figure(report, "verify_capsule", ("all_bit_exact",)), "True"),
        ("`sim_rollout`, 2 actors x 0.5 GPU: episodes, success rate",
         f"{_figure(report, 'sim_rollout', ('episodes',))}, {_figure(report, 'sim_rollout', ('success_rate',), '{:.0%}')}",
         "runs"),
        ("`replay` of one of its episodes bit-exact", _figure(report, "replay", ("exact",)), "True"),
        *slot_rows(report),
    ]
    return report_markdown([
        f"GPU: **{', '.join(env.get('devices', [])) or '?'}**, torch {env.get('torch')}, CUDA {env.get('cuda')}, "
        f"Triton {env.get('triton')}; digests on CUDA: {(env.get('digest_backend') or {}).get('backend')}. "
        f"`make gpu-check`, report `{report['out']}/{REPORT}`.",
        Table(("check", "result", "goal"), rows),
        f"Steps that failed: {', '.join(report['failed']) or 'none'}.",
    ])


def slot_rows(report: dict) -> list[tuple[str, str, str]]:
    """The slots' rows: capture vs eager at every row count, the best layout against one env per process."""
    summary = (report["steps"].get("gpu_slots") or {}).get("summary") or {}
    per_n = (summary.get("a") or {}).get("per_n") or {}
    configs = [c for c in (summary.get("b") or {}).get("configs", []) if c.get("steps_per_s_best")]
    equal = [n for n, r in per_n.items() if r.get("policy_equal") and r.get("critic_equal")]
    rows = [("slots: batched policy and critic captured vs eager, bit-identical at rows",
             f"{', '.join(equal) or 'none'} of {', '.join(per_n) or 'not measured'}", "every one")]
    if len(configs) > 1:
        base, best = configs[0], max(configs[1:], key=lambda c: c["steps_per_s_best"])
        name = lambda c: f"{c['procs']} x {c['slots']} slots x {c.get('env_threads', 1)} env threads"  # noqa: E731
        rows.append((f"slots: steps/s, {name(best)} / {name(base)} (GPU MiB {best.get('smi_mib_total')} / "
                     f"{base.get('smi_mib_total')})", f"{best['steps_per_s_best']:.0f} / {base['steps_per_s_best']:.0f} "
                     f"= {best['steps_per_s_best'] / base['steps_per_s_best']:.2f}x", f">= {SLOTS_GOAL}x"))
    return rows


def run(config: GpuCheckConfig) -> ExperimentResult:
    require_cuda()
    console = make_console()
    out = Path(config.out).resolve()  # the steps run in the repository's root
    out.mkdir(parents=True, exist_ok=True)
    steps: dict[str, dict] = {}
    t0 = time.perf_counter()
    try:
        env, env_error = environment(), None
    except Exception as exc:  # noqa: BLE001 - recorded; the other steps still run
        env, env_error = None, f"{type(exc).__name__}: {exc}"
    steps["environment"] = {"name": "environment", "ok": env_error is None, "error": env_error}
    for step in plan(config, out):
        console.print(f"gpu_check: {step.name} ...")
        steps[step.name] = run_step(step, out, config.step_timeout_s)
        if step.name == "gpu_tests":  # all skipped (no GPU visible to the tests) is no pass
            counts = steps[step.name]["counts"] = junit_counts(out / "gpu_tests.xml")
            steps[step.name]["ok"] &= bool(counts and counts["passed"] > 0)
    replay = replay_step(out)
    if isinstance(replay, Step):
        console.print("gpu_check: replay ...")
        steps["replay"] = run_step(replay, out, config.step_timeout_s)
    else:
        steps["replay"] = {"name": "replay", "ok": False, "skipped": replay}
    for name in ("verify_capsule", "replay"):  # exit 0 is their verdict; a summary must agree
        summary = steps[name].get("summary") or {}
        verdict = summary.get("all_bit_exact", summary.get("exact"))
        if steps[name]["ok"] and verdict is not True:
            steps[name]["ok"] = False
    report = {"environment": env, "steps": steps, "out": str(Path(config.out)),
              "seconds": round(time.perf_counter() - t0, 1),
              "failed": [name for name, rec in steps.items() if not rec["ok"]]}
    report["all_ok"] = not report["failed"]
    path = write_json(out / REPORT, report)
    console.print(_table(report).rich())
    console.print(f"report written to {path}")
    if config.docs:
        write_section(config.docs, "gpu_check", markdown(report))
        console.print(f"results written to {config.docs}")
    return ExperimentResult(report, exit_code=0 if report["all_ok"] else 1)


def _table(report: dict) -> Table:
    """Each step's verdict, exit status, seconds and why it failed (or its log)."""
    rows = []
    for name, rec in report["steps"].items():
        note = rec.get("skipped") or rec.get("error") or ("timed out" if rec.get("timed_out") else "")
        rows.append((name, "yes" if rec["ok"] else "NO", str(rec.get("exit_code", "-")), str(rec.get("seconds", "-")),
                     note or rec.get("log", "")))
    return Table(("step", "ok", "exit", "seconds", "note"), rows, title="gpu_check")


def main(argv: list[str] | None = None) -> int:
    return harness.main(GpuCheckConfig(), run, "benchmarks.gpu_check", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
