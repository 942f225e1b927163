"""consolidate: a sharded store's episodes as one diffusion_policy-layout zarr store (`stores.consolidation`)."""

from __future__ import annotations

import time

from tqdm import tqdm

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import ConsolidateConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.input_bounds import check_output_dir
from capsule_rollout.stores.consolidation import consolidate_store
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.sharded_store import parse_store_root


def run(config: ConsolidateConfig) -> ExperimentResult:
    with checking_inputs():
        check_output_dir(parse_store_root(config.out))
        total = len(open_episode_reader(config.store))
    bar = tqdm(total=total, desc="consolidate", unit="ep", disable=not config.progress)
    start = time.perf_counter()
    try:
        with checking_inputs():
            summary = consolidate_store(config.store, config.out, resume=config.resume,
                                        allow_unverified=config.allow_unverified,
                                        on_episode=lambda episode: bar.update(1))
    finally:
        bar.close()
    elapsed = time.perf_counter() - start
    make_console().print(
        f"{summary.copied} episodes copied ({summary.resumed_from} there before) -> {summary.out}: "
        f"{summary.episodes} episodes, {summary.steps} steps in {elapsed:.1f} s")
    return ExperimentResult({"store": config.store, "out": str(summary.out), "episodes": summary.episodes,
                             "copied": summary.copied, "resumed_from": summary.resumed_from, "steps": summary.steps,
                             "seconds": elapsed})
