"""verify_store: every episode of a store read back and checked against its checksums (`stores.store_check`)."""

from __future__ import annotations

import time

from rich.markup import escape
from tqdm import tqdm

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import VerifyStoreConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.stores import store_damage as D
from capsule_rollout.stores.store_check import check_store


def run(config: VerifyStoreConfig) -> ExperimentResult:
    bar = tqdm(desc="verify", unit="ep", disable=not config.progress)
    start = time.perf_counter()
    try:
        with checking_inputs():
            report = check_store(config.store, on_checked=bar.update)
    finally:
        bar.close()
    elapsed = time.perf_counter() - start
    console = make_console()
    for array, why in report.problems.items():
        console.print(f"[red]damaged[/red] {escape(array)}: {escape(why)}")
    listed = [c for c in report.episodes if c.status != D.OK][: config.show]
    for check in listed:
        what = "; ".join(f"{array}: {why}" for array, why in check.problems.items())
        colour = "red" if check.status == D.DAMAGED else "yellow"
        console.print(f"[{colour}]{check.status}[/{colour}] {escape(check.episode_id)} (#{check.index})"
                      + (f" {escape(what)}" if what else ": recorded without checksums"))
    hidden = sum(c.status != D.OK for c in report.episodes) - len(listed)
    if hidden:
        console.print(f"... and {hidden} more (every verdict is in --json)")
    counts = ", ".join(f"{report.count(s)} {s}" for s in (D.OK, D.DAMAGED, D.UNVERIFIED))
    console.print(f"{report.kind} store {escape(str(report.store))}: {len(report.episodes)} episodes, {counts}"
                  f"{', and damage outside any one episode' if report.problems else ''} in {elapsed:.1f} s")
    summary = report.to_dict()
    if report.damaged:
        console.print(summary["repair"])
    return ExperimentResult({**summary, "seconds": elapsed}, exit_code=1 if report.damaged else 0)
