"""gpu_check: every check of the CUDA path in one run, one JSON report (needs an NVIDIA GPU).

Steps, in order; each but the first runs in its own process, so a crash or a dead
CUDA context in one cannot take the others down, and a failing step is recorded
(exit status, seconds, its JSON summary, the tail of its log) without stopping the rest:

1. `environment`: torch, CUDA and Triton versions, the GPU, the digest backend on CUDA and why;
2. `gpu_tests`: `pytest -m gpu`;
3. `verify_capsule --device cuda`;
4. `bench_capsules --device cuda`; 5. `bench_policy --device cuda`;
6. `sim_rollout --actors 2 --gpus_per_actor 0.5`;
7. `gpu_slots` (`experiments_gpu/gpu_slots.py`): the policy and critic rows captured vs eager at 1 to 64 rows, and
   tabletop episodes on 16 one-env processes against fewer processes of several slots (steps/s, GPU memory);
8. `replay` of the first episode that rollout recorded.

`make gpu-check` installs the CUDA build of torch first. Without a CUDA device this
stops at once, before any step.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from rich.markup import escape
from rich.table import Table

from capsule_rollout.benchmarks.gpu_check import Step, environment, junit_counts, run_step
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.configs import GpuCheckConfig
from capsule_rollout.commands.result import ExperimentResult, write_json
from capsule_rollout.experiments.console import make_console

REPORT = "gpu_check.json"
# the goals the GPU figures are judged against (the CUDA path's design targets)
GRAPH_SPEEDUP_GOAL = 3.0
TWO_LANE_GOAL = 1.15
RESTORE_64MIB_GOAL = 1.2
SLOTS_GOAL = 2.0  # steps/s of the best slot layout over one env per process, the same cores
GPU_SLOTS = Path(__file__).resolve().parents[2] / "experiments_gpu" / "gpu_slots.py"
SLOT_LAYOUTS = ("16x1", "4x4x4", "2x8x8", "4x4x1")  # processes x slots x env threads; the first is the baseline


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise SystemExit(
            f"gpu_check: torch sees no CUDA device (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda or 'none: a CPU build'}). Run `make gpu-check` on a machine with an NVIDIA GPU "
            "and its driver; it installs the CUDA build of torch first."
        )


def plan(config: GpuCheckConfig, out: Path) -> list[Step]:
    """Steps 2-6 (the replay needs the rollout's store, see `replay_step`)."""
    run = (sys.executable, "-m", "capsule_rollout")
    js = {name: out / f"{name}.json" for name in ("verify_capsule", "bench_capsules", "bench_policy", "sim_rollout",
                                                   "gpu_slots")}
    rounds = ("--rounds", str(config.rounds))
    return [
        Step("gpu_tests", (sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                           f"--junitxml={out / 'gpu_tests.xml'}")),
        Step("verify_capsule", (*run, "verify_capsule", "--device", "cuda", "--json", str(js["verify_capsule"])),
             js["verify_capsule"]),
        Step("bench_capsules", (*run, "bench_capsules", "--device", "cuda", *rounds, "--json",
                                str(js["bench_capsules"])), js["bench_capsules"]),
        Step("bench_policy", (*run, "bench_policy", "--device", "cuda", *rounds, "--json", str(js["bench_policy"])),
             js["bench_policy"]),
        Step("sim_rollout", (*run, "sim_rollout", "--actors", "2", "--gpus_per_actor", "0.5", "--seeds.count",
                             str(config.episodes), "--out", str(out / "sim_rollout"), "--video", "false",
                             "--progress", "false", "--json", str(js["sim_rollout"])), js["sim_rollout"]),
        Step("gpu_slots", (sys.executable, str(GPU_SLOTS), "--budget", "330", "--n_exec", "2", "--configs",
                           *SLOT_LAYOUTS, "--out", str(js["gpu_slots"])), js["gpu_slots"]),
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
    env = report.get("environment") or {}
    tests = (report["steps"].get("gpu_tests") or {}).get("counts") or {}
    lines = [
        f"GPU: **{', '.join(env.get('devices', [])) or '?'}**, torch {env.get('torch')}, CUDA {env.get('cuda')}, "
        f"Triton {env.get('triton')}; digests on CUDA: {(env.get('digest_backend') or {}).get('backend')}. "
        f"`make gpu-check`, report `{report['out']}/{REPORT}`.",
        "",
        "| check | result | goal |",
        "|---|---|---|",
        f"| GPU tests (`pytest -m gpu`) | {tests.get('passed', '?')} passed, {tests.get('failures', '?')} failed, "
        f"{tests.get('errors', '?')} errors, {tests.get('skipped', '?')} skipped | all pass |",
        f"| captured `act()` vs eager, batch 1 | "
        f"{_figure(report, 'bench_policy', ('graph', 'speedup'), '{:.1f}x faster')} | >= {GRAPH_SPEEDUP_GOAL}x |",
        f"| policy and critic on two streams / the slower alone | "
        f"{_figure(report, 'bench_policy', ('lanes', _lane, 'two_lane_over_slower'), '{:.2f}x')} | "
        f"<= {TWO_LANE_GOAL}x |",
        f"| 64 MiB device restore / one contiguous device copy | "
        f"{_figure(report, 'bench_capsules', ('sizes', _size(64 << 20), 'restore_over_copy'), '{:.2f}x')} | "
        f"<= {RESTORE_64MIB_GOAL}x |",
        f"| the same, 20 issued back to back (device time, CUDA events) | "
        f"{_figure(report, 'bench_capsules', ('sizes', _size(64 << 20), 'restore_over_copy_back_to_back'), '{:.2f}x')}"
        " | (the goal is the row above) |",
        f"| `verify_capsule --device cuda`: every component bit-exact | "
        f"{_figure(report, 'verify_capsule', ('all_bit_exact',))} | True |",
        f"| `sim_rollout`, 2 actors x 0.5 GPU: episodes, success rate | "
        f"{_figure(report, 'sim_rollout', ('episodes',))}, "
        f"{_figure(report, 'sim_rollout', ('success_rate',), '{:.0%}')} | runs |",
        f"| `replay` of one of its episodes bit-exact | {_figure(report, 'replay', ('exact',))} | True |",
        *slot_rows(report),
        "",
        f"Steps that failed: {', '.join(report['failed']) or 'none'}.",
    ]
    return "\n".join(lines)


def slot_rows(report: dict) -> list[str]:
    """The slots' rows: capture vs eager at every row count, the best layout against one env per process."""
    summary = (report["steps"].get("gpu_slots") or {}).get("summary") or {}
    per_n = (summary.get("a") or {}).get("per_n") or {}
    configs = [c for c in (summary.get("b") or {}).get("configs", []) if c.get("steps_per_s_best")]
    equal = [n for n, r in per_n.items() if r.get("policy_equal") and r.get("critic_equal")]
    rows = [f"| slots: batched policy and critic captured vs eager, bit-identical at rows | "
            f"{', '.join(equal) or 'none'} of {', '.join(per_n) or 'not measured'} | every one |"]
    if len(configs) > 1:
        base, best = configs[0], max(configs[1:], key=lambda c: c["steps_per_s_best"])
        name = lambda c: f"{c['procs']} x {c['slots']} slots x {c.get('env_threads', 1)} env threads"  # noqa: E731
        rows.append(f"| slots: steps/s, {name(best)} / {name(base)} (GPU MiB {best.get('smi_mib_total')} / "
                    f"{base.get('smi_mib_total')}) | {best['steps_per_s_best']:.0f} / {base['steps_per_s_best']:.0f} "
                    f"= {best['steps_per_s_best'] / base['steps_per_s_best']:.2f}x | >= {SLOTS_GOAL}x |")
    return rows


def run(config: GpuCheckConfig) -> ExperimentResult:
    require_cuda()
    console = make_console()
    out = Path(config.out)
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
    report = {"environment": env, "steps": steps, "out": str(out), "seconds": round(time.perf_counter() - t0, 1),
              "failed": [name for name, rec in steps.items() if not rec["ok"]]}
    report["all_ok"] = not report["failed"]
    path = write_json(out / REPORT, report)
    console.print(_table(report))
    console.print(f"report written to {path}")
    if config.docs:
        update_markdown_section(config.docs, "gpu_check", markdown(report))
        console.print(f"results written to {config.docs}")
    return ExperimentResult(report, exit_code=0 if report["all_ok"] else 1)


def _table(report: dict) -> Table:
    table = Table(title="gpu_check")
    for col in ("step", "ok", "exit", "seconds", "note"):
        table.add_column(col)
    for name, rec in report["steps"].items():
        note = rec.get("skipped") or rec.get("error") or ("timed out" if rec.get("timed_out") else "")
        table.add_row(name, "[green]yes[/]" if rec["ok"] else "[red]NO[/]", str(rec.get("exit_code", "-")),
                      str(rec.get("seconds", "-")), escape(note or rec.get("log", "")))
    return table
