"""export_lerobot: a zarr store of episodes as a LeRobot v3.0 dataset that LeRobot's `LeRobotDataset` opens."""

from __future__ import annotations

import time

from tqdm import tqdm

from capsule_rollout.commands.configs import ExportLeRobotConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.experiments.console import make_console
from capsule_rollout.experiments.paths import resolve_input
from capsule_rollout.input_bounds import check_output_dir
from capsule_rollout.stores import lerobot_format as F
from capsule_rollout.stores.lerobot_writer import LeRobotWriterOptions, export_lerobot, open_store
from capsule_rollout.stores.zarr_reader import require_verified, store_episodes

# tabletop.tabletop_env's observation and action, dimension by dimension (its module docstring)
TABLETOP_NAMES = {
    F.OBS_STATE: ["ee_x", "ee_y", "ee_z", "ee_vx", "ee_vy", "ee_vz", "suction_on", "holding"],
    F.ACTION: ["dx", "dy", "dz", "suction"],
}


def run(config: ExportLeRobotConfig) -> ExperimentResult:
    with checking_inputs():
        check_output_dir(config.out, beside=True)
    reader = open_store(resolve_input(config.store))
    indices = F.select_episodes(reader.episode_ids, config.episodes)
    if not config.allow_unverified:
        with checking_inputs():
            require_verified(reader, indices)
    fps = config.fps
    if not fps:
        from capsule_rollout.tabletop.tabletop_env import CONTROL_HZ

        fps = CONTROL_HZ
    options = LeRobotWriterOptions(
        fps=fps, video=config.video, vcodec=config.vcodec, crf=config.crf, robot_type=config.robot_type or None,
        names=TABLETOP_NAMES if config.names == "tabletop" else {})
    frames = int(sum(reader.ends[i] - reader.starts[i] for i in indices))
    bar = tqdm(total=frames, desc="export", unit="frame", disable=not config.progress)
    start = time.perf_counter()
    try:
        summary = export_lerobot(store_episodes(reader, indices), config.out, options, overwrite=config.overwrite,
                                 on_episode=lambda episode: bar.update(episode.length))
    finally:
        bar.close()
    elapsed = time.perf_counter() - start
    result = {
        "store": str(config.store), "out": str(summary.root), "episodes": summary.episodes,
        "frames": summary.frames, "tasks": summary.tasks, "cameras": list(summary.cameras),
        "video": summary.video, "vcodec": config.vcodec if summary.video else None, "fps": fps,
        "seconds": elapsed, "frames_per_s": summary.frames / elapsed if elapsed > 0 else None,
    }
    images = f"{config.vcodec} video" if summary.video else "PNG images"
    make_console().print(
        f"{summary.episodes} episodes, {summary.frames} frames ({images}, {len(summary.cameras)} camera(s)), "
        f"{summary.tasks} tasks -> {summary.root} in {elapsed:.1f} s ({result['frames_per_s']:.0f} frames/s)\n"
        f"open it with LeRobotDataset('<any repo_id>', root='{summary.root}')")
    return ExperimentResult(result)
