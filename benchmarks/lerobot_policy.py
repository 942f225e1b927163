"""A LeRobot policy (ACT, Diffusion) through the adapter vs its network called directly (per network call and per
step), and env slots' steps/s with it; run it where LeRobot is installed (make lerobot-venv).

One torch thread: `.venv-lerobot/bin/python -m benchmarks.lerobot_policy --policies DIR...`.

1. Latency: the adapter (`LeRobotPolicy.act()`) against the same network called directly as LeRobot's own
   evaluation calls it (the image to a float tensor, the preprocessor, `select_action`, the postprocessor), batch 1,
   on one tabletop observation: a step that calls the network (the queue empty: LeRobot's `reset()` before it) and a
   step that hands out a queued action. Interleaved rounds, the methods in shuffled order, medians.
2. Slots: steps/s of a host of N env slots (one model, `LeRobotPolicyRows`) against a host of one slot, the same
   seeds and episodes (every reset a restore after a warm-up pass), paired rounds; the network calls per step.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks import harness
from benchmarks.report import Block, Table, publish
from benchmarks.timing import machine
from capsule_rollout.capsules import Arena
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.policies.conditioning import Conditioning
from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.slots.host import episode_job
from capsule_rollout.rollout.sources import describe_source, load_source
from capsule_rollout.tabletop.tabletop_env import TabletopEnv


@dataclass(frozen=True)
class BenchLeRobotPolicyConfig:
    policies: tuple[str, ...] = ()
    """LeRobot policy directories (`<lerobot-train output>/checkpoints/last/pretrained_model`), each measured."""
    rounds: int = 5
    """Interleaved rounds of the latency measure (order shuffled per round), and paired rounds of steps/s."""
    calls: int = 10
    """Network calls timed per method and round (each followed by the steps its queued actions serve)."""
    slots: int = 4
    """Slots of the batched host (against a host of one slot)."""
    episodes: int = 8
    """Episodes (seeds) per host and round of the steps/s measure."""
    max_steps: int = 40
    """Episode length cap of the steps/s measure."""
    seed: int = 1_000_000
    """First seed of the steps/s measure."""
    docs: str = ""
    """Markdown file whose bench_lerobot_policy section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if min(self.rounds, self.calls, self.episodes, self.max_steps) < 1 or self.slots < 2:
            raise ValueError("--rounds, --calls, --episodes and --max_steps must be >= 1, --slots >= 2")


ENV = "tabletop:pick_place"


def _observation(cameras: tuple[str, ...], size: int) -> dict:
    env = TabletopEnv("pick_place", cameras=cameras, image_size=size)
    obs, _ = env.reset(seed=0)
    env.close()
    return obs


def _adapter(policy, obs: dict) -> Callable[[], tuple[float, list[float]]]:
    """One network call of the adapter and the steps its queue serves: (call s, [step s...])."""
    def run() -> tuple[float, list[float]]:
        policy.reset(1)
        policy.load_observation(obs)
        t0 = time.perf_counter()
        policy.act()
        call = time.perf_counter() - t0
        steps = []
        for _ in range(policy.model.n_action_steps - 1):
            t0 = time.perf_counter()
            policy.load_observation(obs)
            policy.act()
            steps.append(time.perf_counter() - t0)
        return call, steps
    return run


def _direct(model, obs: dict) -> Callable[[], tuple[float, list[float]]]:
    """The same through LeRobot's own calls, as its evaluation makes them."""
    lerobot, visual = model.policy, set(model.visual)

    def batch() -> dict:
        out = {}
        for feature, key in model.keys.items():
            x = torch.from_numpy(obs[key])[None]
            out[feature] = x.permute(0, 3, 1, 2).contiguous().type(torch.float32) / 255 if feature in visual else x
        return out

    def act() -> None:
        model.postprocessor(lerobot.select_action(model.preprocessor(batch())))

    def run() -> tuple[float, list[float]]:
        lerobot.reset()
        t0 = time.perf_counter()
        act()
        call = time.perf_counter() - t0
        steps = []
        for _ in range(model.n_action_steps - 1):
            t0 = time.perf_counter()
            act()
            steps.append(time.perf_counter() - t0)
        return call, steps
    return run


def latency(path: str, config: BenchLeRobotPolicyConfig) -> dict:
    """Per network call and per queued step, adapter vs direct, in ms (medians over every call of every round)."""
    loaded = load_source(path, "policy", device="cpu", conditioning=Conditioning(), noise_scale=1.0)
    policy = loaded.part
    Arena([policy]).allocate()
    obs = _observation(loaded.cameras, loaded.image_size or 64)
    methods = {"adapter": _adapter(policy, obs), "direct": _direct(policy.model, obs)}
    for run in methods.values():  # warm-up
        run()
    calls: dict[str, list[float]] = {k: [] for k in methods}
    steps: dict[str, list[float]] = {k: [] for k in methods}
    rng = random.Random(0)
    for _ in range(config.rounds):
        order = list(methods)
        rng.shuffle(order)
        for name in order:
            for _ in range(config.calls):
                call, served = methods[name]()
                calls[name].append(call)
                steps[name].extend(served)
    ms = {k: {"call_ms": 1e3 * float(np.median(calls[k])), "step_ms": 1e3 * float(np.median(steps[k]))}
          for k in methods}
    model = policy.model
    return {"type": model.type, "path": path, "n_obs_steps": model.n_obs_steps,
            "n_action_steps": model.n_action_steps, "parameters": sum(p.numel() for p in model.policy.parameters()),
            **ms, "call_ratio": ms["adapter"]["call_ms"] / ms["direct"]["call_ms"]}


def slots(path: str, config: BenchLeRobotPolicyConfig) -> dict:
    """Steps/s of `config.slots` slots against one slot, paired rounds (order alternating), medians."""
    spec = RunSpec(env=ENV, policy=path, critic="", threads=1,
                    host=HostConfig(n_exec=1, max_steps=config.max_steps, record_images=False))
    one, many = build_host(spec), build_slots(RunSpec(**{**spec.__dict__, "slots": config.slots}))
    seeds = [config.seed + i for i in range(config.episodes)]
    one_calls = [0]
    policy = one.policy

    def play_one() -> int:
        return sum(one.run_episode(seed).episode.meta.length for seed in seeds)

    def play_many() -> int:
        results = many.run_items([episode_job(seed) for seed in seeds])
        return sum(r.value.episode.meta.length for r in results)

    play_one(), play_many()  # warm-up: each seed's initial capsule made
    rates: dict[str, list[float]] = {"one": [], "slots": []}
    steps_played = {"one": 0, "slots": 0}
    calls = {"one": policy.calls, "slots": many.policy_rows.calls}
    for r in range(config.rounds):
        for name in (("one", "slots") if r % 2 == 0 else ("slots", "one")):
            t0 = time.perf_counter()
            steps = play_one() if name == "one" else play_many()
            rates[name].append(steps / (time.perf_counter() - t0))
            steps_played[name] += steps
    one_calls[0] = policy.calls - calls["one"]
    many_calls = many.policy_rows.calls - calls["slots"]
    ratio = float(np.median([s / o for s, o in zip(rates["slots"], rates["one"])]))
    out = {"slots": config.slots, "episodes": config.episodes, "max_steps": config.max_steps,
           "mode": many.policy_rows.mode, "steps_per_s": {k: float(np.median(v)) for k, v in rates.items()},
           "ratio": ratio, "calls_per_step": {"one": one_calls[0] / steps_played["one"],
                                              "slots": many_calls / steps_played["slots"]},
           "instances": many.report["policy_instances"]}
    one.close()
    many.close()
    return out


def measure(config: BenchLeRobotPolicyConfig, say: Callable[[str], None]) -> dict:
    torch.set_num_threads(1)
    results = []
    for path in config.policies:
        say(f"{path}: latency")
        measured = latency(path, config)
        say(f"{path}: {config.slots} slots against 1")
        measured["slots"] = slots(path, config)
        results.append(measured)
    return {"machine": machine(), "rounds": config.rounds, "calls": config.calls, "policies": results}


def report(summary: dict) -> list[Block]:
    m, first = summary["machine"], summary["policies"][0]["slots"]
    return [f"Device: **cpu** ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, one torch thread; {summary['rounds']} "
            f"rounds of {summary['calls']} network calls per method, medians; steps/s over {first['episodes']} "
            f"pick_place episodes of at most {first['max_steps']} steps per host and round.",
            Table(("measure", "value", "ratio"), _rows(summary), title="bench_lerobot_policy (one torch thread)")]


def _rows(s: dict) -> list[tuple[str, str, str]]:
    rows = []
    for p in s["policies"]:
        a, d, sl = p["adapter"], p["direct"], p["slots"]
        name = f"{p['type']} ({p['parameters'] / 1e6:.1f} M parameters, {p['n_obs_steps']} obs, " \
               f"{p['n_action_steps']} actions a call)"
        rows += [
            (f"{name}: network call, direct / adapter", f"{d['call_ms']:.1f} / {a['call_ms']:.1f} ms",
             f"{p['call_ratio']:.2f}x"),
            (f"{name}: queued step, direct / adapter", f"{d['step_ms']:.3f} / {a['step_ms']:.3f} ms", ""),
            (f"{name}: 1 slot / {sl['slots']} slots ({sl['mode']}, {sl['instances']} model)",
             f"{sl['steps_per_s']['one']:.0f} / {sl['steps_per_s']['slots']:.0f} steps/s", f"{sl['ratio']:.2f}x"),
            (f"{name}: network calls per control step, 1 slot / {sl['slots']} slots",
             f"{sl['calls_per_step']['one']:.3f} / {sl['calls_per_step']['slots']:.3f}", ""),
        ]
    return rows


def run(config: BenchLeRobotPolicyConfig) -> ExperimentResult:
    with checking_inputs():
        if not config.policies:
            raise ValueError("--policies: give one or more LeRobot policy directories (lerobot-train writes "
                             "<output_dir>/checkpoints/last/pretrained_model)")
        for path in config.policies:
            describe_source(resolve_input(path))  # a directory that is no LeRobot policy: refused here
    summary = measure(config, print)
    publish("bench_lerobot_policy", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchLeRobotPolicyConfig(), run, "benchmarks.lerobot_policy", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
