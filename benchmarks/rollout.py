"""Reset by capsule restore vs cold, recording on vs off, 1 vs 2 actors, hand-off latency.

The rollout layer's costs, each pair measured side by side in one run:

1. Episode reset: restoring the seed's initial capsule vs a cold reset (build the
   env, load both checkpoints, reset, first inference), interleaved rounds.
2. Control loop: steps/s of the same episode (same seed, restored: identical work)
   with recording on (EpisodeBuilder + zarr writer thread) and off, alternating.
3. Loop overhead: the host (serial lanes, and two lanes) against a plain hand-written
   loop over the same env, policy and critic objects (policy and critic called one after
   the other, same seeds, same noise: the episodes are checked identical), steps/s of
   the control loop in paired rounds (order shuffled per round); the ratio per round.
4. Throughput: 1 vs 2 Ray actors (warmed up), episodes split between them.
5. Hand-off: publish -> visible latency of the subtask channel, reader spinning,
   in-process (threads) and cross-process (shared memory, a spawned writer).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish, targets
from benchmarks.timing import machine, stats_us
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.learning.options import FAMILIES
from capsule_rollout.rollout.handoff import SubtaskChannel
from capsule_rollout.rollout.host_factory import RunSpec, build_host
from capsule_rollout.rollout.rollout_host import HostConfig, episode_noise_seed
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


@dataclass(frozen=True)
class BenchRolloutConfig:
    policy: str = "checkpoints/policy"
    """Policy checkpoint."""
    critic: str = "checkpoints/critic"
    """Critic checkpoint."""
    family: FAMILIES = "pick_place"
    """Task family."""
    seed: int = 1_000_000
    """First seed used."""
    n_exec: int = 8
    """Actions per chunk executed."""
    max_steps: int = 40
    """Episode length cap (keeps rounds comparable and short)."""
    reset_rounds: int = 50
    """Capsule-restore resets timed."""
    cold_rounds: int = 5
    """Cold resets timed (interleaved with the restores)."""
    record_rounds: int = 6
    """Episode pairs with recording on and off."""
    loop_episodes: int = 4
    """Episodes (seeds) per mode and round of the loop-overhead measurement."""
    loop_rounds: int = 15
    """Paired rounds of host (serial lanes, two lanes) vs hand-written loop."""
    scale_episodes: int = 8
    """Episodes per throughput measurement (1 vs 2 actors)."""
    handoff_samples: int = 500
    """Hand-offs timed per mode."""
    actors_check: bool = True
    """Measure 1 vs 2 Ray actors (starts Ray)."""
    docs: str = ""
    """Markdown file whose bench_rollout section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if min(self.reset_rounds, self.cold_rounds, self.record_rounds, self.scale_episodes, self.loop_episodes,
               self.loop_rounds) < 1:
            raise ValueError("round and episode counts must be >= 1")
        if self.handoff_samples < 10:
            raise ValueError("--handoff_samples must be >= 10")


RESET_TARGET = 100.0  # restore at least 100x faster than a cold reset
RECORD_TARGET = 1.05  # recording costs at most 5%
SCALE_TARGET = 1.8  # 2 actors at least 1.8x one actor's throughput
LOOP_TARGET = 0.97  # the host with serial lanes at least 0.97x a hand-written loop's steps/s


def host_spec(config: BenchRolloutConfig, policy: str, critic: str) -> RunSpec:
    """The host every measurement builds: these checkpoint directories, one torch thread."""
    return RunSpec(env=f"tabletop:{config.family}", policy=policy, critic=critic,
                    host=HostConfig(n_exec=config.n_exec, max_steps=config.max_steps), threads=1)


def resets(config: BenchRolloutConfig, spec: RunSpec) -> dict:
    """Reset by restoring the seed's initial capsule against a cold reset (build the host, reset, first inference),
    interleaved: their statistics (us) and the speed-up."""
    host = build_host(spec)
    host.run_episode(config.seed)  # makes the seed's capsule
    restore_s, cold_s = [], []
    for r in range(config.reset_rounds):
        t0 = time.perf_counter()
        host.reset(config.seed)
        restore_s.append(time.perf_counter() - t0)
        host.phase = host.phase.RECORD  # back to a state RESET may follow
        if r < config.cold_rounds:
            t0 = time.perf_counter()
            cold = build_host(spec)
            _, _, _, obs = cold.reset(config.seed + 1 + r)
            cold._infer(obs)  # the first inference (a capture on CUDA)
            cold_s.append(time.perf_counter() - t0)
            cold.close()
    host.close()
    restore, cold = stats_us(restore_s), stats_us(cold_s)
    return {"restore_us": restore, "cold_us": cold, "speedup": cold["median"] / restore["median"]}


def recording(config: BenchRolloutConfig, spec: RunSpec, tmp: Path) -> dict:
    """Steps/s of the same episode with recording on (a zarr store under `tmp`) and off, alternating in shuffled
    order: the medians and the slowdown."""
    host = build_host(spec)
    host.run_episode(config.seed)
    recorder = ZarrRecorder(tmp / "bench.zarr")
    on, off = [], []
    for r in range(config.record_rounds):
        order = [True, False]
        random.Random(r).shuffle(order)
        for recording in order:
            host.recorder = recorder if recording else None
            result = host.run_episode(config.seed, episode_id=f"bench-{r}-{int(recording)}")
            (on if recording else off).append(result.steps_per_s)
    recorder.close()
    host.close()
    steps = result.episode.meta.length
    med_on, med_off = float(np.median(on)), float(np.median(off))
    return {"steps_per_episode": steps, "on_steps_per_s": med_on, "off_steps_per_s": med_off,
            "slowdown": med_off / med_on}


def hand_written_episode(env, policy, critic, seed: int, *, n_exec: int, limit: int, noise_seed: int = 0):
    """What a user writes without the framework: reset, then chunks of the policy (and the critic's value)
    called one after the other, a new chunk when the subtask changes. Returns (actions, seconds of the
    control loop, the reset excluded)."""
    obs, _ = env.reset(seed=seed)
    policy.reset(episode_noise_seed(noise_seed, env.task, seed))
    subtask = env.subtask_index
    for model in (policy, critic):
        model.set_language(env.subtask_texts[subtask])
    low, high = env.action_space.low, env.action_space.high
    actions = []
    t0 = time.perf_counter()
    while True:
        policy.load_observation(obs)
        critic.load_observation(obs, env.steps)
        chunk = policy.act()[0].numpy()
        critic.evaluate()
        for proposed in chunk[:n_exec]:
            action = np.clip(proposed, low, high)
            obs, _, terminated, truncated, info = env.step(action)
            actions.append(action)
            if terminated or truncated or env.steps >= limit:
                return np.array(actions), time.perf_counter() - t0
            if env.subtask_index != subtask:  # new language, new chunk
                subtask = env.subtask_index
                for model in (policy, critic):
                    model.set_language(env.subtask_texts[subtask])
                break


def loop_overhead(config: BenchRolloutConfig, spec: RunSpec) -> dict:
    """Steps/s of the host (serial lanes; two lanes) vs the hand-written loop on the same objects and seeds, in
    paired rounds: the medians, the ratios to the hand-written loop, and whether the actions were identical."""
    serial = build_host(dataclasses.replace(spec, host=dataclasses.replace(spec.host, lanes="serial")))
    two = build_host(dataclasses.replace(spec, host=dataclasses.replace(spec.host, lanes="two")))
    seeds = list(range(config.seed, config.seed + config.loop_episodes))
    limit = min(spec.host.max_steps or serial.env.max_steps, serial.env.max_steps)
    for host in (serial, two):  # capsules made: every host reset below is a restore
        host.run(seeds)
    rates: dict[str, list[float]] = {"hand": [], "serial": [], "two": []}
    identical = True
    for r in range(config.loop_rounds):
        order = list(rates)
        random.Random(r).shuffle(order)
        for mode in order:
            steps = seconds = 0.0
            for seed in seeds:
                if mode == "hand":
                    actions, dt = hand_written_episode(serial.env, serial.policy, serial.critic, seed,
                                                       n_exec=spec.host.n_exec, limit=limit,
                                                       noise_seed=spec.host.noise_seed)
                    reference = serial.run_episode(seed).episode.steps["action"] if r == 0 else None
                    identical &= reference is None or np.array_equal(actions, reference)
                    steps, seconds = steps + len(actions), seconds + dt
                else:
                    result = (serial if mode == "serial" else two).run_episode(seed)
                    steps, seconds = steps + result.episode.meta.length, seconds + result.run_s
            rates[mode].append(steps / seconds)
    serial.close()
    two.close()
    ratio_serial = [s / h for s, h in zip(rates["serial"], rates["hand"])]
    ratio_two = [t / h for t, h in zip(rates["two"], rates["hand"])]
    return {"episodes": len(seeds), "rounds": config.loop_rounds, "identical_actions": bool(identical),
            **{f"{mode}_steps_per_s": float(np.median(v)) for mode, v in rates.items()},
            "serial_over_hand": float(np.median(ratio_serial)), "two_over_hand": float(np.median(ratio_two)),
            "serial_over_hand_rounds": ratio_serial}


def scaling(config: BenchRolloutConfig, spec: RunSpec) -> dict:
    """Throughput of 1 vs 2 Ray actors (warmed up), unpinned and one core per actor: steps/s and the scaling."""
    from capsule_rollout.rollout.ray_rollout import actor_throughput, init_ray, shutdown_ray

    where = init_ray(num_cpus=2)
    seeds = list(range(config.seed, config.seed + config.scale_episodes))
    try:
        out = {mode: actor_throughput(dataclasses.replace(spec, pin_cores=pinned), seeds, counts=(1, 2, 1, 2))
               for mode, pinned in (("free", False), ("pinned", True))}
    finally:
        shutdown_ray(where)
    return {mode: {"episodes": len(seeds), "one_actor_steps_per_s": float(np.median(r[1])),
                   "two_actors_steps_per_s": float(np.median(r[2])),
                   "scaling": float(np.median(r[2]) / np.median(r[1]))} for mode, r in out.items()}


def _latency_reader(ch: SubtaskChannel, n: int, out: list, timeout_s: float = 60.0, start: int | None = None) -> None:
    """Spin on the version until `start + n`; time each publish seen (one the reader missed is skipped)."""
    start = ch.version() if start is None else start
    seen = ch.version()
    deadline = time.monotonic() + timeout_s
    while seen < start + n and time.monotonic() < deadline:
        v = ch.version()
        if v != seen:
            t = time.perf_counter_ns()
            sub = ch.read()
            seen = sub.version
            out.append(t - int(sub.text))


def _cross_writer(name: str, n: int, gap_s: float, ready) -> None:
    """The spawned writer: publish its clock `n` times, `gap_s` apart, on the shared channel `name`."""
    ch = SubtaskChannel.attach(name)
    ready.set()
    for _ in range(n):
        time.sleep(gap_s)
        ch.publish(str(time.perf_counter_ns()))
    ch.close()


def handoff(config: BenchRolloutConfig) -> dict:
    """Publish -> visible latency of the subtask channel, reader spinning, in-process (a thread) and cross-process
    (shared memory, a spawned writer): statistics in us."""
    n, gap = config.handoff_samples, 0.002
    ch = SubtaskChannel()
    lat: list[int] = []
    reader = threading.Thread(target=_latency_reader, args=(ch, n, lat), kwargs={"start": 0})
    reader.start()
    for _ in range(n):
        time.sleep(gap)
        ch.publish(str(time.perf_counter_ns()))  # CLOCK_MONOTONIC: comparable across processes
    reader.join(30)
    shared = SubtaskChannel.create_shared()
    cross: list[int] = []
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_cross_writer, args=(shared.name, n, gap, ready))
    proc.start()
    ready.wait(60)
    _latency_reader(shared, n, cross, start=0)
    proc.join(30)
    shared.close()
    return {"in_process_us": stats_us([x / 1e9 for x in lat]), "cross_process_us": stats_us([x / 1e9 for x in cross])}


def measure(config: BenchRolloutConfig, spec: RunSpec, progress: Callable[[str], object] = print) -> dict:
    """Every measurement (1 vs 2 actors only with `--actors_check`), the machine and whether each target is met;
    `progress` is told which measurement starts."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_rollout_"))
    try:
        progress("resets ...")
        reset_stats = resets(config, spec)
        progress("recording on/off ...")
        recording_stats = recording(config, spec, tmp)
        progress("loop overhead: host vs hand-written loop ...")
        loop = loop_overhead(config, spec)
        progress("hand-off latency ...")
        handoff_stats = handoff(config)
        progress("1 vs 2 actors ...")
        scaling_stats = scaling(config, spec) if config.actors_check else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"machine": machine(), "checkpoints": {"policy": config.policy, "critic": config.critic},
            "reset": reset_stats, "recording": recording_stats, "loop": loop, "handoff": handoff_stats,
            "scaling": scaling_stats,
            "targets": {
                "reset_speedup_ge_100x": reset_stats["speedup"] >= RESET_TARGET,
                "recording_le_5pct": recording_stats["slowdown"] <= RECORD_TARGET,
                "host_serial_ge_0_97x_hand_loop": loop["serial_over_hand"] >= LOOP_TARGET,
                "two_actors_ge_1_8x": None if scaling_stats is None else max(
                    scaling_stats["free"]["scaling"], scaling_stats["pinned"]["scaling"]) >= SCALE_TARGET,
            }}


def report(summary: dict) -> list[Block]:
    m = summary["machine"]
    return [f"Device: **cpu** ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, one torch thread per host.",
            Table(("measure", "value", "target"), _rows(summary), title="bench_rollout"),
            targets(summary["targets"])]


def _rows(s: dict) -> list[tuple[str, str, str]]:
    r, rec, h, sc, lo = s["reset"], s["recording"], s["handoff"], s["scaling"], s["loop"]
    rows = [
        ("reset: capsule restore (median / p99)", f"{r['restore_us']['median']:.0f} / {r['restore_us']['p99']:.0f} µs", ""),
        ("reset: cold (env + weights + first inference)", f"{r['cold_us']['median'] / 1e3:.0f} ms", ""),
        ("reset speed-up", f"{r['speedup']:.0f}x", "≥ 100x"),
        ("control loop, recording off", f"{rec['off_steps_per_s']:.0f} steps/s", ""),
        ("control loop, recording on (zarr)", f"{rec['on_steps_per_s']:.0f} steps/s", ""),
        ("recording slowdown", f"{(rec['slowdown'] - 1) * 100:+.1f}%", "≤ +5%"),
        ("hand-written loop (policy, critic, env; same objects and seeds)", f"{lo['hand_steps_per_s']:.0f} steps/s", ""),
        ("host, serial lanes", f"{lo['serial_steps_per_s']:.0f} steps/s", ""),
        ("host, two lanes", f"{lo['two_steps_per_s']:.0f} steps/s", ""),
        ("host (serial lanes) / hand-written loop, median of rounds", f"{lo['serial_over_hand']:.3f}", "≥ 0.97"),
        ("host (two lanes) / hand-written loop, median of rounds", f"{lo['two_over_hand']:.3f}", ""),
        ("hand-off in-process (median / p99)",
         f"{h['in_process_us']['median']:.1f} / {h['in_process_us']['p99']:.1f} µs", ""),
        ("hand-off cross-process (median / p99)",
         f"{h['cross_process_us']['median']:.1f} / {h['cross_process_us']['p99']:.1f} µs", ""),
    ]
    for mode, label in (("free", "unpinned"), ("pinned", "one core per actor")):
        if sc:
            r = sc[mode]
            rows += [(f"1 actor ({label})", f"{r['one_actor_steps_per_s']:.0f} steps/s", ""),
                     (f"2 actors ({label})", f"{r['two_actors_steps_per_s']:.0f} steps/s", ""),
                     (f"scaling ({label})", f"{r['scaling']:.2f}x", "≥ 1.8x")]
    return rows


def run(config: BenchRolloutConfig) -> ExperimentResult:
    spec = host_spec(config, resolve_input(config.policy), resolve_input(config.critic))
    summary = measure(config, spec)
    publish("bench_rollout", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchRolloutConfig(), run, "benchmarks.rollout", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
