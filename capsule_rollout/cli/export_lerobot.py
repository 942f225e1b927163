"""export_lerobot: a zarr store of episodes as a LeRobot v3.0 dataset that LeRobot's `LeRobotDataset` opens."""

from __future__ import annotations

import time

from tqdm import tqdm

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import ExportLeRobotConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.input_bounds import check_output_dir
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores import lerobot_format as F
from capsule_rollout.stores.env_description import EnvDescription, read_env_description
from capsule_rollout.stores.lerobot_writer import LeRobotWriterOptions, export_lerobot, open_store
from capsule_rollout.stores.zarr_reader import require_verified, store_episodes

# the episode fields whose dimension names a store records (`stores.env_description`), as LeRobot names them
FEATURES = {"state": F.OBS_STATE, "action": F.ACTION, S.PRIVILEGED: S.PRIVILEGED}


def run(config: ExportLeRobotConfig) -> ExperimentResult:
    with checking_inputs():
        check_output_dir(config.out, beside=True)
    store = resolve_input(config.store)
    reader = open_store(store)
    indices = F.select_episodes(reader.episode_ids, config.episodes)
    with checking_inputs():
        if not config.allow_unverified:
            require_verified(reader, indices)
        described = read_env_description(reader.path)
        fps = config.fps or recorded_fps(described, store)
    names = {FEATURES[k]: v for k, v in (described.names if described else {}).items() if k in FEATURES}
    options = LeRobotWriterOptions(
        fps=fps, video=config.video, vcodec=config.vcodec, crf=config.crf, robot_type=config.robot_type or None,
        names=names if config.names == "store" else {})
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
        "names": {k: list(v) for k, v in options.names.items()},
        "seconds": elapsed, "frames_per_s": summary.frames / elapsed if elapsed > 0 else None,
    }
    images = f"{config.vcodec} video" if summary.video else "PNG images"
    make_console().print(
        f"{summary.episodes} episodes, {summary.frames} frames ({images}, {len(summary.cameras)} camera(s)), "
        f"{summary.tasks} tasks -> {summary.root} in {elapsed:.1f} s ({result['frames_per_s']:.0f} frames/s)\n"
        f"open it with LeRobotDataset('<any repo_id>', root='{summary.root}')")
    return ExperimentResult(result)


def recorded_fps(described: EnvDescription | None, store: str) -> int:
    """The dataset's fps: the control rate the store records, as the integer LeRobot stores; a ValueError
    saying to pass --fps when it records none (a store made before, an env that tells none) or a fractional
    one."""
    rate = described.control_hz if described is not None else None
    if rate is None:
        raise ValueError(f"{store} records no control rate (a store made before rates were kept, or an env that "
                         "tells none: no `dt`, `control_hz` or metadata render_fps): pass --fps, the env's control "
                         "steps per second")
    if abs(rate - round(rate)) > 1e-6:
        raise ValueError(f"{store} was recorded at {rate:g} Hz; LeRobot stores an integer fps: pass --fps")
    return int(round(rate))
