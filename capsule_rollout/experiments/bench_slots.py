"""bench_slots: env slots on one core, each pair measured side by side in one run.

1. Rollouts: steps/s of N slots in one host against one slot, the same seeds and episodes (restored), images
   recorded and not; each lever alone and together (the batched policy and critic call; images on demand).
2. Branch collection: RECAP's branch values from the same recorded episodes, every continuation a fork into the
   slots vs one continuation at a time.
3. The host against a hand-written batched loop (the same envs, rows, seeds and schedule; `reset(seed)` where the
   host restores): steps/s with two lanes and serial ones.
4. Batch invariance: hosts of 1, 4, N and 2N slots with batch-invariant runtimes against the batch as it is:
   steps/s, and whether each records the episodes a host of one slot records.

The measurements are `benchmarks/slots.py`'s; this command prints them and writes its section into `--docs`.
"""

from __future__ import annotations

from capsule_rollout.benchmarks.slots import host_spec, measure
from capsule_rollout.benchmarks.support import update_markdown_section
from capsule_rollout.commands.bench_configs import BenchSlotsConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console, measure_table
from capsule_rollout.experiments.paths import resolve_input


def run(config: BenchSlotsConfig) -> ExperimentResult:
    console = make_console()
    spec = host_spec(config, resolve_input(config.policy), resolve_input(config.critic))
    summary = measure(config, spec, console.print)
    console.print(measure_table(f"bench_slots (one core, {summary['slots']} slots)", _rows(summary)))
    if config.docs:
        update_markdown_section(config.docs, "bench_slots", _markdown(summary))
    return ExperimentResult(summary)


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


def _markdown(s: dict) -> str:
    m, r = s["machine"], s["rollouts"]["not_recorded"]
    lines = [f"Device: **cpu** ({m.get('cpu', '?')}), torch {m.get('torch', '?')}, one torch thread, the process "
             f"pinned to core {s['core']}; the policy acts {s['n_exec']} actions per chunk (as its checkpoint "
             f"records); {r['episodes']} episodes per mode and round, {r['rounds']} paired rounds, medians.", "",
             "| measure | value | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in _rows(s)]
    met = {k: "met" if v else "not met" for k, v in s["targets"].items()}
    lines += ["", "Targets: " + ", ".join(f"{k}: {v}" for k, v in met.items())]
    return "\n".join(lines)
