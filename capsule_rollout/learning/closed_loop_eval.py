"""Closed-loop evaluation over the rollout protocols: playing a list of seeds through the one episode loop
(`RolloutHost`, in this process or on Ray actors) and summarising the episodes.

Every episode is seeded per (task, seed): a seed's result does not depend on which seeds ran before it or
where. What an env adds to the summary comes from an episode observer that writes `extra["eval"]` (`EVAL`):
the failure kind of each failed episode and, where critics ran, their values at the mid-episode step and the
task phase there (the example's `tabletop.tabletop_eval.EvalObserver` is one).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence

import numpy as np

from capsule_rollout.learning.stats import failure_auc_summary, phase_breakdown, wilson_interval
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.ray_rollout import run_rollouts
from capsule_rollout.rollout.record import episode_id_of
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import RolloutHost
from capsule_rollout.rollout.slots.host import instances_by_actor


class EpisodesLostError(RuntimeError):
    """Episodes of an evaluation ended in an error, so there is no figure to give; the message has how many
    and the first error (the entry points print it in one line and exit 1)."""


EVAL = "eval"
"""The key of an evaluation observer's per-episode record in a report's `extra`."""


def outcome_summary(results: list[tuple[bool, int, str]], control_hz: float | None) -> dict:
    """Success (rate, 95% interval, steps to success), simulated time and failure kinds of (success, control
    steps, failure kind) per episode, in seed order; `control_hz`: the env's control steps per second (None
    when unknown: no simulated-time figures)."""
    n = len(results)
    wins = sum(ok for ok, _, _ in results)
    steps = [s for ok, s, _ in results if ok]
    low, high = wilson_interval(wins, n)
    # every episode's control steps, success or not
    sim_seconds = sum(s for _, s, _ in results) / control_hz if control_hz else None
    return {
        "episodes": n,
        "successes": wins,
        "success_rate": wins / n if n else 0.0,
        "ci95": [low, high],
        "mean_steps_to_success": float(np.mean(steps)) if steps else None,
        "sim_seconds": sim_seconds,
        "successes_per_sim_hour": (3600 * wins / sim_seconds if sim_seconds else 0.0) if control_hz else None,
        "failures": dict(Counter(kind for ok, _, kind in results if not ok)),
        "success_by_seed": [int(ok) for ok, _, _ in results],  # in seed order, for paired comparisons
    }


class MidValueObserver(EpisodeObserver):
    """The evaluation record of any env (`extra["eval"]`): the host critic's value at the mid-episode step (the
    last chunk started at or before `mid_step`, default half the episode limit), for its failure AUC. Envs
    that tell failure kinds and task phases bring an observer of their own (the example's
    `tabletop.tabletop_eval.EvalObserver`)."""

    name = EVAL

    def __init__(self, mid_step: int | None = None) -> None:
        self.mid_step = mid_step

    def episode_start(self, host: RolloutHost, seed: int) -> None:
        self.at = host.env.max_steps // 2 if self.mid_step is None else self.mid_step
        self.values: dict[int, float] = {}  # chunk start step -> the host critic's value there

    def chunk(self, host: RolloutHost, chunk: np.ndarray) -> None:
        if host.critic is not None:
            self.values[host.env.steps] = host.value

    def episode_end(self, host: RolloutHost, result) -> None:
        out: dict = {"steps": host.env.steps}
        starts = [s for s in self.values if s <= self.at and s < host.env.steps]
        if starts and host.env.steps > self.at:  # still running at the mid step: judged there
            at = max(starts)
            out.update(mid_step=at, mid_values=[self.values[at]], mid_state_values=[self.values[at]], phase="")
        result.extra[self.name] = out


def evaluate_spec(spec: RunSpec, seeds: Sequence[int], *, task: str, actors: int = 0,
                  mid_step: int | None = None, control_hz: float | None = None) -> dict:
    """Success of the host `spec` describes (any env, policy and critic the rollout protocols take) on `seeds`,
    one episode each (ids `<task>-s<seed>`), on `actors` Ray actors or in this process; with a critic, its
    failure AUC from its values at the mid-episode step (`MidValueObserver`)."""
    observer = (f"{__name__}:MidValueObserver", json.dumps({"mid_step": mid_step}))
    spec = dataclasses.replace(spec, observers=(*spec.observers, observer))
    reports = run_items(spec, [WorkItem(episode_id_of(task, seed), int(seed)) for seed in seeds], actors=actors)
    return summarize(reports, control_hz=control_hz, n_critics=1 if spec.critic else 0)


def run_items(spec: RunSpec, items: list[WorkItem], *, actors: int = 0, host: RolloutHost | None = None) -> list:
    """Play an evaluation's `items` on `actors` Ray actors (one CPU each), or in this process on `host` (closed
    after); their reports in the items' order, whatever order they finished in. An episode that failed before
    its first step fails the evaluation."""
    try:
        reports, _ = run_rollouts(spec, items, actors=actors, host=host, cpus_per_actor=1.0)
    finally:
        if host is not None:
            host.close()
    failed = [r for r in reports if r.episode is None]
    if failed:
        raise EpisodesLostError(f"{len(failed)} of {len(items)} evaluation episodes were lost to errors; the first: "
                                f"{failed[0].error}")
    by_id = {r.item.episode_id: r for r in reports}
    return [by_id[item.episode_id] for item in items]


def summarize(reports: list, *, control_hz: float | None, n_critics: int = 0, plan_critics: Sequence[int] = ()) -> dict:
    """The evaluation summary from the episodes' reports (in seed order), each with `extra["eval"]` (`EVAL`):
    `failure_kind` (any label; "" when the env classifies no failures) and, where critics ran, `mid_values`,
    `mid_state_values` and `phase` at the mid-episode step (see the example's `tabletop.tabletop_eval`)."""
    results = [(bool(r.episode.meta.success), int(r.episode.meta.length),
                 r.extra.get(EVAL, {}).get("failure_kind") or "failed") for r in reports]
    summary = outcome_summary(results, control_hz)
    by_actor = instances_by_actor(reports)
    if by_actor:  # played on slot hosts: the models behind each actor's slots
        summary["instances_by_actor"] = by_actor
    if not n_critics:
        return summary
    mids = [(np.array(r.extra["eval"]["mid_values"]), bool(r.episode.meta.success), r.extra["eval"]["phase"],
             r.extra["eval"]["mid_state_values"]) if "mid_step" in r.extra["eval"]
            else (None, bool(r.episode.meta.success), None, None) for r in reports]
    judged = [(v, ok) for v, ok, _, _ in mids if v is not None]  # episodes still running at the mid step
    aucs = [failure_auc_summary([(float(v[i]), ok) for v, ok in judged]) for i in range(n_critics)]
    summary["critic_failure_auc"] = aucs[0]
    if plan_critics:  # a plan critic's AUC above is its value with the chunk; without it, on the same states
        summary["critic_failure_auc_state_only"] = [
            failure_auc_summary([(float(alone[i]), ok) for v, ok, _, alone in mids if v is not None])
            if i in plan_critics else None for i in range(n_critics)]
    # the first critic against what the task phase alone gives, and within each phase
    if not any(p for v, _, p, _ in mids if v is not None):  # no phases told: nothing to compare with
        return _several(summary, aucs, judged, mids, n_critics)
    phases = phase_breakdown([{"phase": p, "success": ok, "critic_value": float(v[0])}
                              for v, ok, p, _ in mids if v is not None], ["critic_value"])
    summary["phase_alone_failure_auc"] = phases["phase_alone"]
    summary["critic_phases"] = phases["phases"]
    return _several(summary, aucs, judged, mids, n_critics)


def _several(summary: dict, aucs: list, judged: list, mids: list, n_critics: int) -> dict:
    """With more than one critic: each one's AUC, their mean value's, and every mid-episode value."""
    if n_critics > 1:
        summary["critic_failure_aucs"] = aucs
        summary["critic_failure_auc_mean"] = failure_auc_summary([(float(v.mean()), ok) for v, ok in judged])
        # per episode (seed order): each critic's mid-episode value, None where the episode had ended
        summary["critic_mid_values"] = [None if v is None else v.tolist() for v, _, _, _ in mids]
    return summary
