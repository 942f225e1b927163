"""RECAP's yardstick over a study's run seeds (`recap_study`'s history JSON): per arm and iteration, the mean
over seeds of success, successes per sim hour over each seed's BC, the failure ratio (failure rate over BC's),
the control arm, McNemar tests (per seed and pooled over every seed's held-out pairs), the simulated steps,
and the last critic's margin against the branch ceiling on the same states."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from capsule_rollout.learning.stats import paired_comparison

GOALS = {"sim_hour_ratio": 2.0, "failure_ratio": 0.6, "critic_margin": 0.9}  # the yardstick, by iteration 3


def load_history(history: str | Path) -> dict[str, dict[int, dict]]:
    """arm -> run seed -> the arm's summary (finished or partial) from `s<seed>_<arm>.json`; ceilings go in
    each summary under `ceiling`."""
    history = Path(history)
    arms: dict[str, dict[int, dict]] = {}
    for path in sorted(history.glob("s*_*.json")):
        seed_part, _, rest = path.stem.partition("_")
        if not seed_part[1:].isdigit() or rest == "base" or rest.endswith("_ceiling"):
            continue
        data = json.loads(path.read_text())
        ceiling = history / f"{path.stem}_ceiling.json"
        if ceiling.exists():
            data["ceiling"] = json.loads(ceiling.read_text())
        arms.setdefault(rest, {})[int(seed_part[1:])] = data
    return arms


def critic_margin(ceiling: dict) -> float | None:
    """(critic AUC - 0.5) / (ceiling AUC - 0.5) on the ceiling's states (None where either is undefined)."""
    critic, oracle = (ceiling.get("critic_failure_auc") or {}).get("auc"), ceiling["branch_failure_auc"]["auc"]
    if critic is None or oracle is None or oracle <= 0.5:
        return None
    return (critic - 0.5) / (oracle - 0.5)


def _by_seed(runs: dict[int, dict]) -> dict[int, dict[int, dict]]:
    """seed -> iteration -> that iteration's figures."""
    return {s: {it["iteration"]: it for it in runs[s]["iterations"]} for s in sorted(runs)}


def _iterations(by_seed: dict[int, dict[int, dict]]):
    """(iteration, the seeds that reached it, their figures) for every iteration any seed reached, in order."""
    for k in sorted(set().union(*(set(its) for its in by_seed.values()))):
        seeds = [s for s in by_seed if k in by_seed[s]]
        yield k, seeds, [by_seed[s][k] for s in seeds]


def yardstick(runs: dict[int, dict], reference: dict[int, dict] | None = None) -> list[dict]:
    """One row per iteration any seed of `runs` (seed -> an arm's summary) has reached, over the seeds that have
    reached it (`seeds`: a study in progress shows its later iterations on fewer seeds); with a `reference` arm
    (seed -> its summary), the held-out pairs against it at the same iteration, pooled over the seeds both have
    reached it in (`vs_reference`)."""
    by_seed = _by_seed(runs)
    rows = []
    for k, seeds, its in _iterations(by_seed):
        bcs = [by_seed[s][0] for s in seeds]
        row = {"iteration": k, "seeds": seeds,
               "success": [it["success_rate"] for it in its],
               "sim_hour_ratio": [it["successes_per_sim_hour"] / bc["successes_per_sim_hour"]
                                  if bc["successes_per_sim_hour"] else None for it, bc in zip(its, bcs)],
               "failure_ratio": [(1 - it["success_rate"]) / (1 - bc["success_rate"]) for it, bc in zip(its, bcs)],
               "critic_auc": [(it.get("critic_failure_auc_eval") or {}).get("auc") for it in its]}
        pooled_a = [x for it in its for x in it["success_by_seed"]]
        if k and all("control" in it for it in its):
            row["control"] = [it["control"]["success_rate"] for it in its]
            row["paired"] = [it["control"]["paired"] for it in its]
            row["pooled"] = paired_comparison(pooled_a, [x for it in its for x in it["control"]["success_by_seed"]])
        if k:
            row["vs_bc"] = paired_comparison(pooled_a, [x for bc in bcs for x in bc["success_by_seed"]])
            row["simulated_steps"] = [it["simulated_steps"] for it in its]
            row["wall_s"] = [it["wall_s"]["iteration"] for it in its]
        if k and reference:
            pairs = [(by_seed[s][k], ref) for s in seeds for ref in [
                next((it for it in reference.get(s, {}).get("iterations", []) if it["iteration"] == k), None)] if ref]
            if pairs:
                row["vs_reference"] = paired_comparison([x for a, _ in pairs for x in a["success_by_seed"]],
                                                        [x for _, b in pairs for x in b["success_by_seed"]])
                row["vs_reference"]["run_seeds"] = len(pairs)
        last = all(runs[s].get("complete") and runs[s]["iterations"][-1]["iteration"] == k for s in seeds)
        if last and all("ceiling" in runs[s] for s in seeds):
            row["critic_margin"] = [critic_margin(runs[s]["ceiling"]) for s in seeds]
            row["ceiling_auc"] = [runs[s]["ceiling"]["branch_failure_auc"]["auc"] for s in seeds]
            row["ceiling_critic_auc"] = [(runs[s]["ceiling"].get("critic_failure_auc") or {}).get("auc")
                                         for s in seeds]
        for key in ("success", "sim_hour_ratio", "failure_ratio", "control", "critic_margin"):
            if key in row and all(v is not None for v in row[key]):
                row[f"{key}_mean"] = float(np.mean(row[key]))
        rows.append(row)
    return rows


def _f(values, fmt: str) -> str:
    return " / ".join("-" if v is None else format(v, fmt) for v in values)


def markdown(arms: dict[str, dict[int, dict]], reference: str = "critic") -> str:
    """The yardstick's table: one row per arm and iteration, each seed's figure and the mean; every other arm is
    also paired with the `reference` arm at the same iteration."""
    lines = ["| arm | it | seeds | success (each seed; mean) | control | McNemar vs control: pooled only RECAP / only "
             f"control, p | vs the {reference} arm: pooled only this / only {reference}, p | successes per sim hour x "
             "BC (mean; goal 2) | failure ratio (mean; goal 0.6) | critic AUC held out | critic margin vs ceiling "
             "(goal 0.9) | simulated steps: rollouts + branches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, runs in sorted(arms.items()):
        for row in yardstick(runs, arms.get(reference) if arm != reference else None):
            seeds = ", ".join(str(s) for s in row["seeds"])
            success = f"{_f(row['success'], '.1%')}; **{row['success_mean']:.1%}**"
            control = f"{_f(row['control'], '.1%')}; {row['control_mean']:.1%}" if "control" in row else "-"
            pooled = (f"{row['pooled']['only_a']} / {row['pooled']['only_b']}, p = {row['pooled']['p_value']:.3g}"
                      if "pooled" in row else "-")
            versus = (f"{row['vs_reference']['only_a']} / {row['vs_reference']['only_b']}, "
                      f"p = {row['vs_reference']['p_value']:.3g}" if "vs_reference" in row else "-")
            ratio = (f"{_f(row['sim_hour_ratio'], '.2f')}; **{row['sim_hour_ratio_mean']:.2f}**"
                     if "sim_hour_ratio_mean" in row else _f(row["sim_hour_ratio"], ".2f"))
            failure = f"{_f(row['failure_ratio'], '.2f')}; **{row['failure_ratio_mean']:.2f}**"
            margin = (f"{_f(row['critic_margin'], '.2f')}" + (f"; **{row['critic_margin_mean']:.2f}**"
                                                             if "critic_margin_mean" in row else "")
                      if "critic_margin" in row else "-")
            steps = (" / ".join(f"{s['rollouts']:,} + {s['branches']:,}" for s in row["simulated_steps"])
                     if "simulated_steps" in row else "-")
            lines.append(f"| {arm} | {row['iteration']} | {seeds} | {success} | {control} | {pooled} | {versus} | {ratio} | "
                         f"{failure} | {_f(row['critic_auc'], '.2f')} | {margin} | {steps} |")
    return "\n".join(lines)


def evaluation_sizes(runs: dict[int, dict], sizes=(50, 100, 200, 400), draws: int = 2000,
                     seed: int = 0) -> list[dict]:
    """What an evaluation of n held-out seeds per run seed would have told, from an arm's measured pairs with
    its control (seed -> an arm's summary): per iteration with a control in every run seed that reached it and
    per n, n pairs drawn with replacement from each such run seed's held-out pairs `draws` times, the fraction
    of draws whose pooled McNemar test gives p < 0.05 (the power at the measured effect), the median 95%
    half-width of one seed's success rate, and the evaluation's measured wall time scaled to n (both policies)."""
    rng = np.random.default_rng(seed)
    rows = []
    for k, seeds, its in _iterations(_by_seed(runs)):
        if not k or not all("control" in it for it in its):
            continue
        pairs = [np.array([it["success_by_seed"], it["control"]["success_by_seed"]], dtype=bool) for it in its]
        eval_s = float(np.mean([it["wall_s"]["evaluation_s"] / len(it["success_by_seed"]) for it in its]))
        for n in sizes:
            significant, half = 0, []
            for _ in range(draws):
                picks = [p[:, rng.integers(0, p.shape[1], n)] for p in pairs]
                a, b = np.concatenate([p[0] for p in picks]), np.concatenate([p[1] for p in picks])
                significant += paired_comparison(a, b)["p_value"] < 0.05
                rate = picks[0][0].mean()
                half.append(1.96 * np.sqrt(rate * (1 - rate) / n))
            rows.append({"iteration": k, "seeds": seeds, "n": n, "power": significant / draws,
                         "half_width": float(np.median(half)), "evaluation_s": eval_s * n})
    return rows


def evaluation_sizes_markdown(arms: dict[str, dict[int, dict]], reference: str = "critic", **kwargs) -> str:
    """`evaluation_sizes` of the `reference` arm as a table."""
    lines = [f"| it | seeds | held-out seeds per run seed | power of the pooled McNemar test at the {reference} "
             "arm's measured effect (p < 0.05) | 95% half-width, one seed's success | evaluation wall s (both "
             "policies, one seed) |", "|---|---|---|---|---|---|"]
    for row in evaluation_sizes(arms.get(reference, {}), **kwargs):
        seeds = ", ".join(str(s) for s in row["seeds"])
        lines.append(f"| {row['iteration']} | {seeds} | {row['n']} | {row['power']:.2f} | "
                     f"{row['half_width']:.1%} | {row['evaluation_s']:.0f} |")
    return "\n".join(lines)
