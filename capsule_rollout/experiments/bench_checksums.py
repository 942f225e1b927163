"""bench_checksums: what the stores' checksums cost, side by side in one process.

Per round and image kind: `--episodes` synthetic episodes recorded into a fresh zarr store with checksums
and into another without (`ZarrRecorder(checksums=False)`, the format before them), each timed from the
first `write` to the recorder's close: recorded control steps/s. The store with checksums is then read
whole with and without verifying (`ZarrEpisodeReader(verify=False)`), in blocks as `consolidate` and
`export_lerobot` read (`store_episodes`) and episode by episode as `replay` does: decoded MB/s, the
files in the page cache (what the checksums cost the CPU, not the disk). The pairs alternate which goes
first (reads: `--read_repeats` each, interleaved, the fastest counting); figures are medians over rounds,
ratios the medians of the rounds' ratios, of the rates (wall clock) and of the CPU seconds the process
spent (every thread). The hashing alone (every step array of every episode, as the recorder does) is
timed too, and given as a share of an episode's recording and block reading without checksums: the
figure the noise of a shared machine disturbs least.

The measurements are `benchmarks/checksums.py`'s; this command prints them.
"""

from __future__ import annotations

from rich.table import Table

from capsule_rollout.benchmarks.checksums import measure
from capsule_rollout.commands.configs import BenchChecksumsConfig
from capsule_rollout.commands.result import ExperimentResult
from capsule_rollout.experiments.console import make_console


def run(config: BenchChecksumsConfig) -> ExperimentResult:
    summary = measure(config)
    table = Table(title=f"bench_checksums ({config.episodes} episodes of {config.steps} steps, {config.cameras} x "
                        f"{config.image_size}x{config.image_size} cameras; medians of {config.rounds} rounds; "
                        "ratios: with / without, medians of the rounds' ratios)")
    for name in ("images", "measure", "with", "without", "rate ratio", "CPU s ratio"):
        table.add_column(name, justify="right")
    for r in summary["rows"]:
        for what, unit in (("record", "steps/s"), ("read blocks", "MB/s"), ("read one by one", "MB/s")):
            m = r[what]
            table.add_row(r["images"], f"{what} ({unit})", f"{m[unit + ' with']:.0f}", f"{m[unit + ' without']:.0f}",
                          f"{m['rate ratio']:.3f}", f"{m['cpu ratio']:.3f}")
    console = make_console()
    console.print(table)
    for r in summary["rows"]:
        h = r["hash"]
        console.print(f"{r['images']}: hashing an episode's {r['mb_per_episode']:.2f} MB alone takes "
                      f"{h['ms/episode']:.2f} ms ({h['GB/s']:.1f} GB/s): "
                      f"{h['share of recording'] * 100:.1f}% of recording it, "
                      f"{h['share of a block read'] * 100:.1f}% of reading it in blocks (without checksums)")
    return ExperimentResult(summary)
