"""The statistics the evaluations report: success intervals, failure AUC, paired comparisons."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mid_episode_value(values: np.ndarray, at_step: int) -> float | None:
    """The critic's value at control step `at_step`: that of the last chunk started at or before it.

    `values` holds one entry per control step, finite where a chunk started (NaN elsewhere).
    None when the episode ended before observing step `at_step` or no critic ran by then. The
    step is the same for every episode (callers pass half the episode limit): a point taken
    from each episode's own length would depend on its outcome, since successes end early.
    """
    at = mid_episode_step(values, at_step)
    return None if at is None else float(values[at])


def mid_episode_step(values: np.ndarray, at_step: int) -> int | None:
    """The control step whose value `mid_episode_value` takes (None where it gives None)."""
    if at_step < 0:
        raise ValueError(f"at_step must be >= 0, got {at_step}")
    if len(values) <= at_step:
        return None
    at = np.flatnonzero(np.isfinite(values[: at_step + 1]))
    return int(at[-1]) if len(at) else None


def failure_auc(pairs: Sequence[tuple[float, bool]]) -> float | None:
    """AUC of "low value predicts failure": P(value of a failure < value of a success), ties count half.

    `pairs`: (value, success) per episode. None when either class is empty.
    """
    fail = np.array([v for v, ok in pairs if not ok])
    good = np.array([v for v, ok in pairs if ok])
    if not len(fail) or not len(good):
        return None
    less = (fail[:, None] < good[None, :]).sum() + 0.5 * (fail[:, None] == good[None, :]).sum()
    return float(less / (len(fail) * len(good)))


def auc_interval(auc: float, n_fail: int, n_success: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval of an AUC from its Hanley-McNeil (1982) standard error."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n_fail - 1) * (q1 - auc * auc) + (n_success - 1) * (q2 - auc * auc)) / (n_fail * n_success)
    half = z * math.sqrt(max(var, 0.0))
    return (max(0.0, auc - half), min(1.0, auc + half))


def failure_auc_summary(pairs: Sequence[tuple[float, bool]]) -> dict:
    """`failure_auc` with its interval and the class counts (auc None when a class is empty)."""
    n_success = sum(ok for _, ok in pairs)
    n_fail = len(pairs) - n_success
    auc = failure_auc(pairs)
    return {"auc": auc, "ci95": list(auc_interval(auc, n_fail, n_success)) if auc is not None else None,
            "episodes": len(pairs), "failures": n_fail, "successes": n_success}


def paired_comparison(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """Two policies on the same seeds: discordant pairs and the exact two-sided McNemar p-value.

    `only_a`: seeds a solved and b did not; the p-value is that of a sign test over
    the discordant seeds (how likely a split at least this uneven is if a and b were
    equally good).
    """
    if len(a) != len(b):
        raise ValueError(f"paired comparison needs outcomes on the same seeds ({len(a)} vs {len(b)})")
    only_a = sum(bool(x) and not bool(y) for x, y in zip(a, b))
    only_b = sum(bool(y) and not bool(x) for x, y in zip(a, b))
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n if n else 1.0
    return {"seeds": len(a), "only_a": only_a, "only_b": only_b,
            "both": sum(bool(x) and bool(y) for x, y in zip(a, b)), "p_value": min(1.0, 2 * tail)}


def phase_breakdown(rows: Sequence[dict], scores: Sequence[str]) -> dict:
    """How far a value predicts failure beyond knowing the task phase a state is in.

    `rows`: one per judged state, with `phase` (a label: subtask and what the gripper holds),
    `success` and each key of `scores` (higher: more likely to succeed). Returns `phases`, per
    phase: states, successes and each score's failure AUC within that phase (None where a phase
    has one outcome only); and `phase_alone`: the failure AUC of each state's phase success
    rate, what a value that knows the phase and nothing else would reach (within a phase every
    pair ties; one rate is fitted per phase, a handful against the states scored; a
    leave-one-out rate would be biased instead, ranking a phase's successes below its failures).
    """
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(str(row["phase"]), []).append(row)
    phases = {}
    for name, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        phases[name] = {"states": len(members), "successes": sum(bool(r["success"]) for r in members),
                        **{key: failure_auc_summary([(float(r[key]), bool(r["success"])) for r in members])
                           for key in scores}}
    rates = [(phases[str(r["phase"])]["successes"] / phases[str(r["phase"])]["states"], bool(r["success"]))
             for r in rows]
    return {"phases": phases, "phase_alone": failure_auc_summary(rates)}
