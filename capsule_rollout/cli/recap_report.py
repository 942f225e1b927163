"""How `recap` and `recap_study` print a finished RECAP iteration (shared by both commands)."""

from __future__ import annotations


def report_iteration(console, it: dict) -> None:
    """One finished RECAP iteration's figures, printed as `recap` prints them."""
    lo, hi = it["ci95"]
    console.print(f"iteration {it['iteration']}: success {it['success_rate']:.0%} (95% CI {lo:.0%}-{hi:.0%}), "
                  f"mean steps to success {it['mean_steps_to_success']}, "
                  f"interventions per rollout {it['interventions_per_episode']:.2f}, "
                  f"{it['successes_per_sim_hour']:.0f} successes per sim hour"
                  + (f", guidance beta {it['beta']:g}" if it.get("beta") is not None else ""))
    if "wall_s" in it:
        w = it["wall_s"]
        console.print(f"  wall time {w['iteration']:.0f} s on {w['actors'] or 'no'} Ray actors: rollouts "
                      f"{w['rollouts_s']:.0f} s" + (f", branches {w['branches_s']:.0f} s" if w.get("branches_s") else "")
                      + f", training {w['training_s']:.0f} s, evaluation {w['evaluation_s']:.0f} s")
    if "simulated_steps" in it:
        sim, b = it["simulated_steps"], it.get("branching")
        total = sim["rollouts"] + sim["branches"]
        console.print(f"  simulated {total} control steps: rollouts {sim['rollouts']}"
                      + (f", branches {sim['branches']} ({sim['branches'] / total:.0%}; {_branched(b)})" if b else "")
                      + f"; labels on {it['labelled_fraction']:.0%} of the steps ({it['advantage_source']}"
                      + (f", from branch values on {b['branch_fraction']:.0%}" if b and "branch_fraction" in b else "")
                      + ")")
    if "guidance" in it:
        alone = it["guidance"]["indicator_alone"]
        console.print(f"  the positive indicator alone (no guidance): {alone['success_rate']:.0%}")
    auc = it.get("critic_failure_auc_eval") or {}
    if auc.get("auc") is not None:
        console.print(f"  critic failure AUC (value at mid-episode step, held-out episodes): {auc['auc']:.2f} "
                      f"(95% CI {auc['ci95'][0]:.2f}-{auc['ci95'][1]:.2f}; "
                      f"{auc['failures']} failures, {auc['successes']} successes)")
        phase = it["phase_alone_failure_auc_eval"]
        if phase["auc"] is not None:
            console.print(f"  the task phase alone (its success rate) on the same states: {phase['auc']:.2f}")
    if "control" in it:
        c, paired = it["control"], it["control"]["paired"]
        console.print(f"  control (same data and steps, no labels): {c['success_rate']:.0%} "
                      f"(95% CI {c['ci95'][0]:.0%}-{c['ci95'][1]:.0%}); seeds only RECAP solved "
                      f"{paired['only_a']}, only the control {paired['only_b']}, McNemar p = {paired['p_value']:.3f}")


def _branched(b: dict) -> str:
    if "screen" in b:  # `open`: the screening pass, then the open chunks' boundaries
        return (f"{b['screened_boundaries']} boundaries screened with {b['screen']} continuations, "
                f"{b['boundaries']} of open chunks with {b['branches']} more, {b['episodes_branched']} episodes")
    return (f"{b['boundaries']} boundaries of {b['episodes_branched']} episodes, {b['branches']} continuations each, "
            f"chunks {b.get('select', 'random')}")
