"""Kernel paths: one slot and 8 slots of the shipped policy under each kernel path torch can be forced to on this CPU.

Under each path (`ATEN_CPU_CAPABILITY`, `ONEDNN_MAX_CPU_ISA`, `MKL_ENABLE_INSTRUCTIONS`, set before torch loads: a
process each, one after another, pinned to one core), the tabletop host with the shipped policy and critic, images
not recorded, every reset a restore after a warm-up pass, in paired rounds (order shuffled per round):

- a host of 8 slots against a host of one, both batch-invariant (the default), images drawn every step and on
  demand: the ratio the slots exist for;
- the one-slot host batch-invariant against the same host with the network over the batch as it is: what
  invariance costs a single slot;
- whether the 8 slots' policy and critic rows ran in one call (`together`: else one row at a time) and whether
  the 8 slots recorded the one-slot host's episodes (actions, states, values).

`--before CHECKOUT`: the same child run on an earlier tree (its package first on the path), alternating with this
one, path by path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = {
    "default": {},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-scalar": {"ATEN_CPU_CAPABILITY": "default"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
"""The kernel paths, as the environment that forces each (`tests/models/test_kernel_paths.py` tests the same)."""
PATH_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
"""What `PATHS` set: taken out of the environment a path's process starts with, then set as the path says."""
SLOTS_TARGET, ONE_SLOT_TARGET = 1.5, 0.95  # issue 62: 8 slots / 1 under each path; one slot invariant / as is


@dataclass(frozen=True)
class KernelPathsConfig:
    paths: tuple[str, ...] = tuple(PATHS)
    """Kernel paths measured (names of `PATHS`)."""
    slots: int = 8
    """Slots of the batched host."""
    episodes: int = 32
    """Episodes (seeds) per mode and round (4 per slot: the 8 slots full but for each round's tail)."""
    max_steps: int = 80
    """Episode length cap."""
    rounds: int = 3
    """Paired rounds per path."""
    seed: int = 1_000_000
    """First seed used."""
    before: str = ""
    """An earlier checkout measured the same way, alternating with this one (empty: none)."""
    docs: str = ""
    """Markdown file whose bench_kernel_paths section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        unknown = [p for p in self.paths if p not in PATHS]
        if unknown or self.slots < 2 or min(self.episodes, self.rounds) < 1:
            raise ValueError(f"--paths from {sorted(PATHS)} (unknown: {unknown}); --slots >= 2; --episodes, "
                             "--rounds >= 1")


def child(config: dict) -> dict:
    """One kernel path, in this process (the environment already set): the measures above, as a dict."""
    import numpy as np
    import torch

    from benchmarks.slots import _played, _same, _with
    from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots, resolve_acting
    from capsule_rollout.rollout.rollout_host import HostConfig

    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    shipped = ROOT / "capsule_rollout" / "checkpoints"
    policy, critic = str(shipped / "policy"), str(shipped / "critic")
    n_exec, noise_scale = resolve_acting(policy, None)
    spec = RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, noise_scale=noise_scale, threads=1,
                   host=HostConfig(n_exec=n_exec, max_steps=config["max_steps"], record_images=False))
    seeds = list(range(config["seed"], config["seed"] + config["episodes"]))
    one = build_host(spec)
    as_is = build_host(dataclasses.replace(spec, batch_invariant=False))
    many = build_slots(dataclasses.replace(spec, slots=config["slots"]))

    def play(host, lazy: bool) -> tuple[int, list]:
        _with(host, images_on_demand=lazy)
        return _played(host, seeds)

    played = {"one": play(one, False)[1], "slots": play(many, False)[1]}  # capsules made, traces warm
    play(as_is, False)
    modes = {"one_drawn": (one, False), "one_on_demand": (one, True), "slots_drawn": (many, False),
             "slots_on_demand": (many, True), "one_as_is": (as_is, False)}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(config["rounds"]):
        order = list(modes)
        random.Random(r).shuffle(order)
        for mode in order:
            t0 = time.perf_counter()
            steps, _ = play(*modes[mode])
            rates[mode].append(steps / (time.perf_counter() - t0))
    same = _same(played["one"], played["slots"])
    rows = [getattr(many.policy_rows, "runtime", None), getattr(many.critic_rows, "runtime", None)]
    for host in (one, as_is, many):
        host.close()

    def ratio(a: str, b: str) -> float:
        return float(np.median([x / y for x, y in zip(rates[a], rates[b], strict=True)]))

    return {"capability": torch.backends.cpu.get_cpu_capability(), "core": core,
            "steps_per_s": {m: float(np.median(v)) for m, v in rates.items()}, "per_round": rates,
            "slots_over_one_drawn": ratio("slots_drawn", "one_drawn"),
            "slots_over_one_on_demand": ratio("slots_on_demand", "one_on_demand"),
            "one_invariant_over_as_is": ratio("one_drawn", "one_as_is"),
            "policy_rows_in_one_call": bool(getattr(rows[0], "together", False)),
            "critic_rows_in_one_call": bool(getattr(rows[1], "together", False)),
            "slots_record_one_slots_episodes": bool(same)}


def _run_child(config: KernelPathsConfig, path: str, checkout: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PATH_VARIABLES}
    env.update(PATHS[path])
    first = str(Path(checkout).resolve()) if checkout else str(ROOT)
    env["PYTHONPATH"] = os.pathsep.join([first, str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    settings = json.dumps({k: getattr(config, k) for k in ("slots", "episodes", "max_steps", "rounds", "seed")})
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", settings], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"kernel path {path} ({checkout or 'this checkout'}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(config: KernelPathsConfig, progress=print) -> dict:
    found: dict[str, dict] = {}
    for path in config.paths:
        progress(f"kernel path {path} ...")
        found[path] = {"now": _run_child(config, path)}
        if config.before:
            found[path]["before"] = _run_child(config, path, config.before)
    now = [p["now"] for p in found.values()]
    return {"paths": found, "slots": config.slots, "episodes": config.episodes, "rounds": config.rounds,
            "before": config.before or None,
            "targets": {"slots_ge_1_5x_each_path": all(max(p["slots_over_one_drawn"], p["slots_over_one_on_demand"])
                                                       >= SLOTS_TARGET for p in now),
                        "one_slot_ge_0_95x_each_path": all(p["one_invariant_over_as_is"] >= ONE_SLOT_TARGET
                                                           for p in now),
                        "rows_in_one_call_each_path": all(p["policy_rows_in_one_call"] and p["critic_rows_in_one_call"]
                                                          for p in now),
                        "same_episodes_each_path": all(p["slots_record_one_slots_episodes"] for p in now)}}


def report(summary: dict) -> list:
    from benchmarks.report import Table, targets
    from benchmarks.timing import machine

    m, n = machine(), summary["slots"]
    rows = []
    for path, runs in summary["paths"].items():
        for which, p in runs.items():
            v = p["steps_per_s"]
            label = path + (" (before)" if which == "before" else "")
            rows.append((label, p["capability"], f"{v['one_drawn']:.0f} / {v['slots_drawn']:.0f}",
                         f"{p['slots_over_one_drawn']:.2f}x", f"{p['slots_over_one_on_demand']:.2f}x",
                         f"{v['one_drawn']:.0f} / {v['one_as_is']:.0f} ({p['one_invariant_over_as_is']:.3f}x)",
                         f"{p['policy_rows_in_one_call']} / {p['critic_rows_in_one_call']}",
                         str(p["slots_record_one_slots_episodes"])))
    return [f"Device: **cpu** ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, one torch thread, each path a "
            f"process of its own pinned to one core; the shipped policy and critic, tabletop pick_place, images not "
            f"recorded; {summary['episodes']} episodes per mode and round, {summary['rounds']} paired rounds per "
            "path, medians" + (f"; before: `{summary['before']}`" if summary["before"] else "") + ".",
            Table(("kernel path", "torch's capability", f"1 slot / {n} slots, steps/s (images drawn)",
                   f"{n} / 1, images drawn", f"{n} / 1, images on demand (target ≥ 1.5x)",
                   "1 slot invariant / as is (target ≥ 0.95x)", "policy / critic rows in one call",
                   f"{n} slots record the 1-slot host's episodes"), rows,
                  title=f"bench_kernel_paths ({n} slots against one, each kernel path)"),
            targets(summary["targets"])]


def run(config: KernelPathsConfig):
    from benchmarks.report import publish
    from capsule_rollout.commands.result import ExperimentResult

    summary = measure(config)
    publish("bench_kernel_paths", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    from benchmarks import harness

    return harness.main(KernelPathsConfig(), run, "benchmarks.kernel_paths", __doc__, argv)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
