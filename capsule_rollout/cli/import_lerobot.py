"""import_lerobot: the episodes of a local LeRobot v3.0 dataset into a zarr store (resumable)."""

from __future__ import annotations

import time

from tqdm import tqdm

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import ImportLeRobotConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.input_bounds import check_output_dir
from capsule_rollout.stores import lerobot_format as F
from capsule_rollout.stores.lerobot_reader import LeRobotDatasetReader
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


def run(config: ImportLeRobotConfig) -> ExperimentResult:
    with checking_inputs():
        check_output_dir(config.out)
        reader = LeRobotDatasetReader(resolve_input(config.src), id_prefix=config.id_prefix or None)
        if not config.allow_unverified:
            reader.require_verified()
        ids = [reader.episode_id(i) for i in range(len(reader))]
        indices = F.select_episodes(ids, config.episodes)
    recorder = ZarrRecorder(config.out)
    imported = skipped = frames = 0
    bar = tqdm(indices, desc="import", unit="ep", disable=not config.progress)
    start = time.perf_counter()
    try:
        for i in bar:
            if ids[i] in recorder:
                skipped += 1
                continue
            with checking_inputs():  # an episode that fails validation: one line naming it
                episode = reader.episode(i)
                recorder.write(episode)
            imported += 1
            frames += episode.length
        recorder.flush()
    finally:
        bar.close()
        recorder.close()
        reader.close()
    elapsed = time.perf_counter() - start
    make_console().print(f"{imported} episodes ({frames} frames) imported, {skipped} already in the store "
                         f"-> {config.out} in {elapsed:.1f} s")
    return ExperimentResult({"src": str(config.src), "store": str(config.out), "episodes": imported,
                             "frames": frames, "skipped_already_recorded": skipped, "seconds": elapsed})
