"""Env slots: steps/s of 8 slots in one actor vs 1 slot, and RECAP branch collection with forks in the batch vs one
continuation at a time, on one core.

A host of N env slots against a host of one, on one core, the same policy, critic,
seeds and episodes (every reset a restore after a warm-up pass).

1. Rollouts: steps/s (wall time of the whole set of episodes) of N slots vs 1, images recorded and not, with each
   lever alone and together: the batched policy and critic call (slots), and images rendered only for the steps
   that read them (`HostConfig.images_on_demand`).
2. Branch collection (RECAP's branch values): `BranchActor` over the same `BranchItem`s (each recorded episode
   played again, then `branches` continuations from each boundary): branch steps per second with every
   continuation a fork into the slots, side by side, vs one continuation at a time on one slot.
3. The host against a hand-written batched loop over the same envs, rows, seeds and schedule (`hand_batched_loop`),
   with two lanes (the default) and serial ones.
4. Batch invariance: hosts of 1, 4, N and 2N slots with batch-invariant runtimes against the batch as it is.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from benchmarks import harness
from benchmarks.report import Block, Table, publish, targets
from benchmarks.timing import machine
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.learning.options import FAMILIES
from capsule_rollout.rollout.branching import BranchActor, BranchItem
from capsule_rollout.rollout.host_config import two_lanes
from capsule_rollout.rollout.host_factory import RunSpec, build_host, build_slots, resolve_acting
from capsule_rollout.rollout.rollout_host import HostConfig, episode_noise_seed
from capsule_rollout.rollout.slots.host import episode_job


@dataclass(frozen=True)
class BenchSlotsConfig:
    policy: str = "checkpoints/policy"
    """Policy checkpoint."""
    critic: str = "checkpoints/critic"
    """Critic checkpoint."""
    family: FAMILIES = "pick_place"
    """Task family."""
    slots: int = 8
    """Slots of the batched host (against a host of one slot)."""
    n_exec: int | None = None
    """Actions per chunk executed (None: as the policy checkpoint records, else 8)."""
    seed: int = 1_000_000
    """First seed used."""
    episodes: int = 32
    """Episodes (seeds) per mode and round of the rollout measurement."""
    max_steps: int = 80
    """Episode length cap."""
    rounds: int = 5
    """Paired rounds (order shuffled per round)."""
    branch_items: int = 2
    """Recorded episodes branched per round of the branch measurement (each played again, then branched)."""
    branch_steps: tuple[int, ...] = (2, 6, 10)
    """Chunk starts branched from."""
    branches: int = 8
    """Continuations per boundary."""
    docs: str = ""
    """Markdown file whose bench_slots section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.slots < 2 or min(self.episodes, self.rounds, self.branch_items, self.branches) < 1:
            raise ValueError("--slots must be >= 2; --episodes, --rounds, --branch_items, --branches >= 1")


SLOTS_TARGET = 1.3  # N slots at least 1.3x one slot's steps/s on one core
BRANCH_TARGET = 1.5  # branch collection with forks in the batch at least 1.5x one continuation at a time
HAND_TARGET = 0.97  # a host of N slots (default lanes) at least 0.97x a hand-written batched loop's steps/s


def host_spec(config: BenchSlotsConfig, policy: str, critic: str) -> RunSpec:
    """One slot, one torch thread, the policy acting as its checkpoint records (as sim_rollout runs it)."""
    n_exec, noise_scale = resolve_acting(policy, config.n_exec)
    return RunSpec(env=f"tabletop:{config.family}", policy=policy, critic=critic, noise_scale=noise_scale,
                    host=HostConfig(n_exec=n_exec, max_steps=config.max_steps), threads=1)


@contextmanager
def one_core():
    """This process (and its lanes' threads) on one core."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield min(before)
    finally:
        os.sched_setaffinity(0, before)


def _with(host, **changes) -> None:
    for h in getattr(host, "hosts", [host]):
        h.config = dataclasses.replace(h.config, **changes)


def _ratios(rates: dict[str, list[float]]) -> Callable[[str, str], float]:
    """The median over rounds of mode a's rate over mode b's (paired: the same round)."""
    return lambda a, b: float(np.median([x / y for x, y in zip(rates[a], rates[b], strict=True)]))


def rollouts(config: BenchSlotsConfig, spec: RunSpec, progress: Callable[[str], object]) -> dict:
    seeds = list(range(config.seed, config.seed + config.episodes))
    out = {}
    for record in (False, True):
        progress(f"rollouts, images recorded: {record} ...")
        base = dataclasses.replace(spec, host=dataclasses.replace(spec.host, record_images=record))
        one, many = build_host(base), build_slots(dataclasses.replace(base, slots=config.slots))
        one.run(seeds)  # capsules made, traces warm: every reset below is a restore
        many.run(seeds)
        modes = {f"{n}_{lazy}": (host, lazy) for n, host in (("one", one), ("slots", many))
                 for lazy in ("drawn", "on_demand")}
        rates: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(config.rounds):
            order = list(modes)
            random.Random(r).shuffle(order)
            for mode in order:
                host, lazy = modes[mode]
                _with(host, images_on_demand=lazy == "on_demand")
                t0 = time.perf_counter()
                if host is one:
                    steps = sum(one.run_episode(s).episode.meta.length for s in seeds)
                else:
                    steps = sum(x.value.episode.meta.length for x in many.run_items([episode_job(s) for s in seeds]))
                rates[mode].append(steps / (time.perf_counter() - t0))
        fill = many.rows_served / max(many.calls, 1)
        one.close()
        many.close()
        med = {m: float(np.median(v)) for m, v in rates.items()}
        ratio = _ratios(rates)
        out["recorded" if record else "not_recorded"] = {
            "steps_per_s": med, "rounds": config.rounds, "episodes": len(seeds), "rows_per_call": fill,
            "per_round": rates,
            "slots_alone": ratio("slots_drawn", "one_drawn"),
            "slots_same_images": ratio("slots_on_demand", "one_on_demand"),
            "slots_and_images_on_demand": ratio("slots_on_demand", "one_drawn"),
            "images_on_demand_alone": ratio("one_on_demand", "one_drawn")}
    return out


def branch_collection(config: BenchSlotsConfig, spec: RunSpec, progress: Callable[[str], object]) -> dict:
    progress("branch collection ...")
    spec = dataclasses.replace(spec, host=dataclasses.replace(spec.host, record_images=False))
    items = [BranchItem(f"b{k}", config.seed + 100 + k, steps=tuple(config.branch_steps), branches=config.branches)
             for k in range(config.branch_items)]
    actors = {"one": BranchActor(spec), "slots": BranchActor(dataclasses.replace(spec, slots=config.slots))}
    for actor in actors.values():
        actor.run_batch(items[:1])  # capsules made, traces warm
    modes = {f"{n}_{lazy}": (actor, lazy) for n, actor in actors.items() for lazy in ("drawn", "on_demand")}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    values: dict[str, list] = {}
    for r in range(config.rounds):
        order = list(modes)
        random.Random(r).shuffle(order)
        for mode in order:
            actor, lazy = modes[mode]
            _with(actor.host, images_on_demand=lazy == "on_demand")
            t0 = time.perf_counter()
            reports = actor.run_batch(items)
            wall = time.perf_counter() - t0
            if any(rep.error for rep in reports):
                raise RuntimeError(f"branch collection failed: {[rep.error for rep in reports if rep.error]}")
            rates[mode].append(sum(rep.extra["branch_steps"] for rep in reports) / wall)
            values.setdefault(mode, [rep.extra["branch_values"] for rep in reports])
    for actor in actors.values():
        actor.close()
    ratio = _ratios(rates)
    return {"branch_steps_per_s": {m: float(np.median(v)) for m, v in rates.items()}, "rounds": config.rounds,
            "per_round": rates,
            "items": len(items), "continuations_per_item": config.branches * len(config.branch_steps),
            "values_same_with_images_on_demand": values["one_drawn"] == values["one_on_demand"]
            and values["slots_drawn"] == values["slots_on_demand"],
            "slots_alone": ratio("slots_drawn", "one_drawn"),
            "slots_and_images_on_demand": ratio("slots_on_demand", "one_drawn"),
            "images_on_demand_alone": ratio("one_on_demand", "one_drawn")}


def _played(host, seeds: list[int]) -> tuple[int, list]:
    """Steps and episodes of `seeds` on a host of one slot or of several."""
    if hasattr(host, "run_items"):
        episodes = [x.value.episode for x in host.run_items([episode_job(s) for s in seeds])]
    else:
        episodes = [host.run_episode(s).episode for s in seeds]
    return sum(e.meta.length for e in episodes), episodes


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(x.steps[k]), np.asarray(y.steps[k]), equal_nan=True)  # NaN: no value asked
               for x, y in zip(a, b, strict=True) for k in ("action", "state", "value"))


def hand_batched_loop(slots, seeds: list[int], *, n_exec: int, limit: int, noise_seed: int = 0
                      ) -> tuple[dict[int, np.ndarray], int]:
    """What a user writes for N envs and one batched policy and critic without the framework, over a slot host's
    own envs and rows: each env takes the next seed when its episode ends (`reset(seed)`, the policy's noise
    seeded as the host seeds it, the subtask's language), and every round makes one batched call over the envs
    whose chunk ran out, then steps each env through its chunk's first `n_exec` actions (an episode ends at
    success, termination, truncation or `limit` steps; a new subtask ends the chunk). Images are rendered only for
    the observations the models read. Returns each seed's actions and the steps played."""
    hosts = slots.hosts
    envs, policies, critics = [h.env for h in hosts], [h.policy for h in hosts], [h.critic for h in hosts]
    models = lambda i: [m for m in (policies[i], critics[i]) if m is not None]  # noqa: E731
    for env in envs:
        env.images_wanted = False
    low, high = envs[0].action_space.low, envs[0].action_space.high
    todo, playing, actions, steps = list(reversed(seeds)), {}, {}, 0

    def begin(i: int) -> None:
        seed, env = todo.pop(), envs[i]
        env.reset(seed=seed)
        policies[i].reset(episode_noise_seed(noise_seed, env.task, seed))
        for model in models(i):
            model.set_language(env.subtask_texts[env.subtask_index])
        playing[i] = {"seed": seed, "subtask": env.subtask_index, "queue": [], "actions": []}

    for i in range(len(envs)):
        if todo:
            begin(i)
    while playing:
        need = [i for i in sorted(playing) if not playing[i]["queue"]]
        for i in need:
            envs[i].images_wanted = True
            obs = envs[i].observe()
            envs[i].images_wanted = False
            policies[i].load_observation(obs)
            if critics[i] is not None:
                critics[i].load_observation(obs, envs[i].steps)
        chunks = slots.policy_rows.act_rows(need)
        if slots.critic_rows is not None:
            slots.critic_rows.evaluate_rows(need)
        for i in need:
            playing[i]["queue"] = list(chunks[i].reshape(-1, low.shape[0]).numpy()[:n_exec])
        for i in sorted(playing):
            mine, env = playing[i], envs[i]
            while mine["queue"]:
                action = np.clip(mine["queue"].pop(0), low, high)
                _, _, terminated, truncated, info = env.step(action)
                mine["actions"].append(action)
                steps += 1
                if terminated or truncated or env.steps >= limit or env.success(info):
                    actions[mine["seed"]] = np.array(mine["actions"])
                    del playing[i]
                    if todo:
                        begin(i)
                    break
                if env.subtask_index != mine["subtask"]:  # new language, new chunk
                    mine["subtask"], mine["queue"] = env.subtask_index, []
                    for model in models(i):
                        model.set_language(env.subtask_texts[env.subtask_index])
    for env in envs:
        env.images_wanted = True
    return actions, steps


def host_vs_hand(config: BenchSlotsConfig, spec: RunSpec, progress: Callable[[str], object]) -> dict:
    """Steps/s of a host of N slots (the default lanes, `auto`; two lanes; serial lanes) against the hand-written
    batched loop over the same envs, rows, seeds and schedule, in paired rounds; and whether the actions are the
    same."""
    progress("host vs a hand-written batched loop ...")
    seeds = list(range(config.seed, config.seed + config.episodes))
    base = dataclasses.replace(spec, host=dataclasses.replace(spec.host, record_images=False), slots=config.slots)
    hosts = {lanes: build_slots(dataclasses.replace(base, host=dataclasses.replace(base.host, lanes=lanes)))
             for lanes in ("auto", "two", "serial")}
    limit = min(base.host.max_steps or hosts["two"].env.max_steps, hosts["two"].env.max_steps)
    played = {lanes: {r.value.episode.meta.seed: r.value.episode.steps["action"]
                      for r in host.run_items([episode_job(s) for s in seeds])} for lanes, host in hosts.items()}
    hand, _ = hand_batched_loop(hosts["serial"], seeds, n_exec=base.host.n_exec, limit=limit,
                                noise_seed=base.host.noise_seed)
    same = all(np.array_equal(hand[s], mine[s]) for s in seeds for mine in played.values())
    rates: dict[str, list[float]] = {"hand": [], "auto": [], "two": [], "serial": []}
    for r in range(config.rounds):
        order = list(rates)
        random.Random(r).shuffle(order)
        for mode in order:
            t0 = time.perf_counter()
            if mode == "hand":
                _, steps = hand_batched_loop(hosts["serial"], seeds, n_exec=base.host.n_exec, limit=limit,
                                             noise_seed=base.host.noise_seed)
            else:
                steps = sum(x.value.episode.meta.length for x in hosts[mode].run_items([episode_job(s) for s in seeds]))
            rates[mode].append(steps / (time.perf_counter() - t0))
    for host in hosts.values():
        host.close()
    ratio = _ratios(rates)
    return {"episodes": len(seeds), "rounds": config.rounds, "same_actions": bool(same),
            "steps_per_s": {m: float(np.median(v)) for m, v in rates.items()}, "per_round": rates,
            "auto_lanes": "two" if two_lanes(hosts["auto"].config, hosts["auto"].hosts[0].policy.device) else "serial",
            "auto_over_hand": ratio("auto", "hand"), "two_over_hand": ratio("two", "hand"),
            "serial_over_hand": ratio("serial", "hand")}


def invariance_cost(config: BenchSlotsConfig, spec: RunSpec, progress: Callable[[str], object]) -> dict:
    progress("batch invariance ...")
    seeds = list(range(config.seed, config.seed + config.episodes))
    base = dataclasses.replace(spec, host=dataclasses.replace(spec.host, record_images=False))
    counts = sorted({1, 4, config.slots, 2 * config.slots})
    hosts, episodes = {}, {}
    for n in counts:
        for invariant in (True, False):
            spec_n = dataclasses.replace(base, batch_invariant=invariant, slots=n)
            host = build_host(spec_n) if n == 1 else build_slots(spec_n)
            hosts[(n, invariant)] = host
            episodes[(n, invariant)] = _played(host, seeds)[1]  # capsules made, traces warm
    rates: dict[tuple[int, bool], list[float]] = {m: [] for m in hosts}
    for r in range(config.rounds):
        order = list(hosts)
        random.Random(r).shuffle(order)
        for mode in order:
            t0 = time.perf_counter()
            steps, _ = _played(hosts[mode], seeds)
            rates[mode].append(steps / (time.perf_counter() - t0))
    for host in hosts.values():
        host.close()
    rows = []
    for n in counts:
        invariant, as_is = rates[(n, True)], rates[(n, False)]
        rows.append({"slots": n, "steps_per_s_invariant": float(np.median(invariant)),
                     "steps_per_s_as_is": float(np.median(as_is)),
                     "ratio": float(np.median([a / b for a, b in zip(invariant, as_is, strict=True)])),
                     "same_as_one_slot_invariant": _same(episodes[(n, True)], episodes[(1, True)]),
                     "same_as_one_slot_as_is": _same(episodes[(n, False)], episodes[(1, False)])})
    return {"episodes": len(seeds), "rounds": config.rounds, "rows": rows,
            "per_round": {f"{n}_{'invariant' if b else 'as_is'}": v for (n, b), v in rates.items()}}


def measure(config: BenchSlotsConfig, spec: RunSpec, progress: Callable[[str], object] = print) -> dict:
    with one_core() as core:
        roll = rollouts(config, spec, progress)
        branch = branch_collection(config, spec, progress)
        hand = host_vs_hand(config, spec, progress)
        invariance = invariance_cost(config, spec, progress)
    best = max(roll["not_recorded"]["slots_and_images_on_demand"], roll["recorded"]["slots_same_images"])
    return {"machine": machine(), "core": core, "slots": config.slots, "n_exec": spec.host.n_exec,
            "rollouts": roll, "branch": branch, "hand_written": hand, "batch_invariance": invariance,
            "targets": {"slots_ge_1_3x": best >= SLOTS_TARGET, "host_ge_0_97x_hand": hand["auto_over_hand"] >= HAND_TARGET,
                        "branch_ge_1_5x": branch["slots_and_images_on_demand"] >= BRANCH_TARGET}}


def report(summary: dict) -> list[Block]:
    m, r = summary["machine"], summary["rollouts"]["not_recorded"]
    return [f"Device: **cpu** ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, one torch thread, the process "
            f"pinned to core {summary['core']}; the policy acts {summary['n_exec']} actions per chunk (as its "
            f"checkpoint records); {r['episodes']} episodes per mode and round, {r['rounds']} paired rounds, medians.",
            Table(("measure", "value", "target"), _rows(summary),
                  title=f"bench_slots (one core, {summary['slots']} slots)"),
            targets(summary["targets"])]


def _rows(s: dict) -> list[tuple[str, str, str]]:
    n, rows = s["slots"], []
    for key, label in (("not_recorded", "images not recorded"), ("recorded", "images recorded")):
        r = s["rollouts"][key]
        v = r["steps_per_s"]
        rows += [
            (f"{label}: 1 slot / {n} slots, images drawn every step",
             f"{v['one_drawn']:.0f} / {v['slots_drawn']:.0f} steps/s", ""),
            (f"{label}: 1 slot / {n} slots, images on demand",
             f"{v['one_on_demand']:.0f} / {v['slots_on_demand']:.0f} steps/s", ""),
            (f"{label}: {n} slots / 1, slots alone (images drawn in both)", f"{r['slots_alone']:.2f}x", ""),
            (f"{label}: {n} slots / 1, images on demand in both", f"{r['slots_same_images']:.2f}x", "≥ 1.3x"),
            (f"{label}: images on demand alone (1 slot)" + (
                " (nothing to skip when images are recorded: the same code twice, a check of the noise)"
                if key == "recorded" else ""), f"{r['images_on_demand_alone']:.2f}x", ""),
            (f"{label}: {n} slots + images on demand / 1 slot drawing every step",
             f"{r['slots_and_images_on_demand']:.2f}x", ""),
            (f"{label}: rows filled per batched call (of {n})", f"{r['rows_per_call']:.2f}", ""),
        ]
    b = s["branch"]
    v = b["branch_steps_per_s"]
    rows += [
        ("branches: 1 slot, one continuation at a time (images drawn / on demand)",
         f"{v['one_drawn']:.0f} / {v['one_on_demand']:.0f} branch steps/s", ""),
        (f"branches: {n} slots, forks in the batch (images drawn / on demand)",
         f"{v['slots_drawn']:.0f} / {v['slots_on_demand']:.0f} branch steps/s", ""),
        ("branches: forks in the batch alone", f"{b['slots_alone']:.2f}x", ""),
        ("branches: images on demand alone", f"{b['images_on_demand_alone']:.2f}x", ""),
        ("branches: forks in the batch + images on demand / today's", f"{b['slots_and_images_on_demand']:.2f}x",
         "≥ 1.5x"),
        ("branch values the same with images on demand", str(b["values_same_with_images_on_demand"]), "True"),
    ]
    h = s["hand_written"]
    v = h["steps_per_s"]
    rows += [(f"hand-written batched loop over the same {n} envs and rows, seeds and schedule", f"{v['hand']:.0f} steps/s",
              ""),
             (f"host of {n} slots, default lanes (auto: {h['auto_lanes']} here) / two lanes / serial lanes",
              f"{v['auto']:.0f} / {v['two']:.0f} / {v['serial']:.0f} steps/s", ""),
             ("host (default lanes) / hand-written batched loop, median of rounds", f"{h['auto_over_hand']:.3f}",
              "≥ 0.97"),
             ("host (two lanes) / hand-written batched loop, median of rounds", f"{h['two_over_hand']:.3f}", ""),
             ("host (serial lanes) / hand-written batched loop, median of rounds", f"{h['serial_over_hand']:.3f}", ""),
             ("the hand-written loop plays the host's actions", str(h["same_actions"]), "True")]
    for row in s["batch_invariance"]["rows"]:
        rows += [(f"batch-invariant runtimes: {row['slots']} slot(s), steps/s invariant / the batch as is",
                  f"{row['steps_per_s_invariant']:.0f} / {row['steps_per_s_as_is']:.0f} ({row['ratio']:.3f}x)",
                  "≥ 0.9x" if row["slots"] == n else ""),
                 (f"batch-invariant runtimes: {row['slots']} slot(s) record the 1-slot host's episodes, invariant / "
                  "as is", f"{row['same_as_one_slot_invariant']} / {row['same_as_one_slot_as_is']}", "True / -")]
    return rows


def run(config: BenchSlotsConfig) -> ExperimentResult:
    spec = host_spec(config, resolve_input(config.policy), resolve_input(config.critic))
    summary = measure(config, spec)
    publish("bench_slots", report(summary), config.docs)
    return ExperimentResult(summary)


def main(argv: list[str] | None = None) -> int:
    return harness.main(BenchSlotsConfig(), run, "benchmarks.slots", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
