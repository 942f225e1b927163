"""What env slots cost in memory when the policy is large: an actor's resident memory with N slots against one,
for an `infer` object holding `weights_mb` of weights that batches (`infer_batch`: one object per actor) and for
the same object without `infer_batch` (one instance per slot). Each layout is measured in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from capsule_rollout.rollout.host_factory import HostSpec, build_host, build_slots
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.slot_host import episode_job

ENV = "examples.own_env_and_policy:make_env"
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
    spec = HostSpec(env=ENV, policy=f"{__name__}:{factory}", slots=slots, host=HostConfig(n_exec=8, max_steps=40))
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
    code = (f"import json; from {__name__} import measure_layout; "
            f"print(json.dumps(measure_layout({factory!r}, {slots}, {weights_mb}, {episodes})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
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
