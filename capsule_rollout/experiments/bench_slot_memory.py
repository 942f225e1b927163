"""bench_slot_memory: an actor's resident memory with N env slots against one, for an `infer` policy holding large
weights: one batched object per actor (`infer_batch`) against an instance per slot. Each layout is measured in a
fresh process (`benchmarks/slot_memory.py`); this command prints them and writes its section into `--docs`."""

from __future__ import annotations

from capsule_rollout.benchmarks.slot_memory import measure
from capsule_rollout.benchmarks.support import machine, update_markdown_section
from capsule_rollout.commands.bench_configs import BenchSlotMemoryConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console, measure_table


def run(config: BenchSlotMemoryConfig) -> ExperimentResult:
    console = make_console()
    summary = {**measure(config.slots, config.weights_mb, config.episodes, config.rounds), "machine": machine()}
    console.print(measure_table(f"bench_slot_memory ({config.weights_mb} MB of weights)", _rows(summary)))
    if config.docs:
        update_markdown_section(config.docs, "bench_slot_memory", _markdown(summary))
    return ExperimentResult(summary)


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


def _markdown(s: dict) -> str:
    m = s["machine"]
    lines = [f"Device: **cpu** ({m.get('cpu', '?')}); the example env (`examples/own_env_and_policy.py`), a policy "
             f"object holding {s['weights_mb']} MB of read-only weights, {s['episodes']} episodes played before "
             f"the memory is read, each layout in a fresh process, {s['rounds']} rounds alternated, medians.", "",
             "| measure | value | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in _rows(s)]
    return "\n".join(lines)
