"""Env slots and a large policy: an actor's memory with N slots vs one, one batched infer object per actor against an
instance per slot.

An `infer` object holding `weights_mb` of weights that batches (`infer_batch`: one object per actor) and the same
object without `infer_batch` (one instance per slot); each layout measured in a fresh process (its memory is the
actor's alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.slots.host import episode_job


@dataclass(frozen=True)
class BenchSlotMemoryConfig:
    slots: int = 8
    """Slots of the batched host (against a host of one slot)."""
    weights_mb: int = 200
    """Weights the policy object holds (a read-only array: taken by reference, never copied into a capsule)."""
    episodes: int = 8
    """Episodes played in each layout before its memory is read."""
    rounds: int = 3
    """Times each layout is measured (fresh processes, alternated); medians."""
    docs: str = ""
    """Markdown file whose bench_slot_memory section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.slots < 2 or min(self.weights_mb, self.episodes, self.rounds) < 1:
            raise ValueError("--slots must be >= 2; --weights_mb, --episodes and --rounds >= 1")


ENV = "examples.own_env_and_policy:make_env"
MODULE = "benchmarks.slot_memory"  # by name: the layouts run in processes of their own, which import it
ROOT = Path(__file__).resolve().parents[1]  # the repository (its examples/ and benchmarks/)
WEIGHTS_MB = 200  # set by `measure_layout` in the child process before the factory is called


class WeightedPush:
    """A push toward the goal scaled by a read-only weight table of `WEIGHTS_MB` (as a VLA's weights would sit in
    an `infer` object); one instance serves every slot."""

    chunk_length = 8
    observation_keys = ("state",)  # no camera: the env renders nothing (a renderer per slot is the env's cost)

    def __init__(self) -> None:
        self.weights = np.full(WEIGHTS_MB * 2**20 // 4, 1.0, np.float32)
        self.weights.flags.writeable = False

    def _push(self, s: np.ndarray, noise: np.ndarray) -> np.ndarray:
        return np.clip(self.weights[0] * 3.0 * (s[..., None, 4:6] - s[..., None, 0:2]) + 0.2 * noise, -1.0, 1.0)

    def infer(self, obs, *, noise):
        return self._push(obs["state"], noise)

    def infer_batch(self, obs, *, noise):
        return self._push(obs["state"], noise)


class WeightedPushOneRow(WeightedPush):
    infer_batch = None  # does not batch: an instance per slot


def batching() -> WeightedPush:
    return WeightedPush()


def looping() -> WeightedPushOneRow:
    return WeightedPushOneRow()


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure_layout(factory: str, slots: int, weights_mb: int, episodes: int) -> dict:
    """In this process: build a host of `slots` slots with the policy `factory`, play `episodes`; RSS (MB)."""
    global WEIGHTS_MB
    WEIGHTS_MB = weights_mb
    base = _rss_mb()
    spec = RunSpec(env=ENV, policy=f"{MODULE}:{factory}", slots=slots, host=HostConfig(n_exec=8, max_steps=40))
    host = build_slots(spec) if slots > 1 else build_host(spec)
    built = _rss_mb()
    if slots > 1:
        results = [r.value for r in host.run_items([episode_job(s) for s in range(episodes)])]
    else:
        results = [host.run_episode(s) for s in range(episodes)]
    played = _rss_mb()
    instances = len(getattr(getattr(host, "policy_rows", None), "parts", [None])) if slots > 1 else 1
    host.close()
    return {"factory": factory, "slots": slots, "rss_before_mb": base, "rss_built_mb": built,
            "rss_played_mb": played, "policy_instances": instances,
            "errors": sum(1 for r in results if r.error)}


def run_layout(factory: str, slots: int, weights_mb: int, episodes: int) -> dict:
    """`measure_layout` in a fresh Python process (its memory is the actor's alone)."""
    code = (f"import json; from {MODULE} import measure_layout; "
            f"print(json.dumps(measure_layout({factory!r}, {slots}, {weights_mb}, {episodes})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the {factory} x {slots} measurement failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(slots: int, weights_mb: int, episodes: int, rounds: int) -> dict:
    """Each layout `rounds` times, alternated: one slot, `slots` slots batching, `slots` slots one per slot."""
    layouts = [("batching", 1), ("batching", slots), ("looping", slots)]
    runs: dict[str, list[dict]] = {f"{f}x{n}": [] for f, n in layouts}
    for _ in range(rounds):
        for f, n in layouts:
            runs[f"{f}x{n}"].append(run_layout(f, n, weights_mb, episodes))
    med = {k: float(np.median([r["rss_played_mb"] for r in v])) for k, v in runs.items()}
    return {"slots": slots, "weights_mb": weights_mb, "episodes": episodes, "rounds": rounds, "runs": runs,
            "rss_mb": med, "batching_ratio": med[f"batching{'x'}{slots}"] / med["batchingx1"],
            "looping_ratio": med[f"loopingx{slots}"] / med["batchingx1"],
            "instances": {k: v[0]["policy_instances"] for k, v in runs.items()}}


def report(summary: dict) -> list[Block]:
    m = summary["machine"]
    return [f"Device: **cpu** ({m.get('cpu', '?')}); the example env (`examples/own_env_and_policy.py`), a policy "
            f"object holding {summary['weights_mb']} MB of read-only weights, {summary['episodes']} episodes played "
            f"before the memory is read, each layout in a fresh process, {summary['rounds']} rounds alternated, "
            "medians.",
            Table(("measure", "value", "target"), _rows(summary),
                  title=f"bench_slot_memory ({summary['weights_mb']} MB of weights)")]


def _rows(s: dict) -> list[tuple[str, str, str]]:
    n, rss, inst = s["slots"], s["rss_mb"], s["instances"]
    return [
        ("1 slot: actor RSS (median)", f"{rss['batchingx1']:.0f} MB", ""),
        (f"{n} slots, one batched object ({inst[f'batchingx{n}']} instance): actor RSS",
         f"{rss[f'batchingx{n}']:.0f} MB", ""),
        (f"{n} slots / 1 slot, one batched object", f"{s['batching_ratio']:.2f}x", "≤ 1.1x"),
        (f"{n} slots, an instance per slot ({inst[f'loopingx{n}']} instances): actor RSS",
         f"{rss[f'loopingx{n}']:.0f} MB", ""),
        (f"{n} slots / 1 slot, an instance per slot", f"{s['looping_ratio']:.2f}x", ""),
    ]


def run(config: BenchSlotMemoryConfig) -> ExperimentResult:
    summary = {**measure(config.slots, config.weights_mb, config.episodes, config.rounds), "machine": machine()}
    publish("bench_slot_memory", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchSlotMemoryConfig(), run, MODULE, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
