"""Configs of the commands that convert or check episode stores: consolidate, export_lerobot, import_lerobot,
verify_store (standard library only: the CLI stays fast)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from capsule_rollout.commands.registry import command


@command("consolidate", "Write a sharded store's episodes as one diffusion_policy-layout zarr store (resumable).")
@dataclass(frozen=True)
class ConsolidateConfig:
    store: str = "runs/sim_rollout/episodes.zarr"
    """Episode store to read: a sharded store root (sim_rollout --shards true) or a zarr store; a path or file:///path."""
    out: str = "runs/sim_rollout/consolidated.zarr"
    """The single zarr store written (zarr format 2: data/<key>, meta/episode_ends, meta/<field>)."""
    resume: bool = False
    """Continue an interrupted consolidation into an existing --out (else an existing --out is refused)."""
    allow_unverified: bool = False
    """Copy episodes recorded without checksums too (they get checksums of what they hold now); else refused."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if not self.store or not self.out or self.store == self.out:
            raise ValueError("--store (the store to read) and --out (the zarr store to write, another one) are required")


@command(
    'export_lerobot',
    "Export a store as a LeRobot v3.0 dataset (parquet frames, mp4 per camera, tasks, stats) for LeRobot's loader.",
)
@dataclass(frozen=True)
class ExportLeRobotConfig:
    store: str = "runs/demos/pick_place.zarr"
    """Episode store to export: a zarr store or a sharded store root (what collect_demos, sim_rollout or real_recap
    wrote)."""
    out: str = "runs/lerobot/dataset"
    """Output directory: a new LeRobot v3.0 dataset (an existing one is refused unless --overwrite)."""
    video: bool = True
    """Camera images as one mp4 per camera (LeRobot's default); --no-video: PNG images in the parquet files."""
    episodes: tuple[str, ...] = ()
    """Episodes to export, by id or index in the store; none: all."""
    fps: int = 0
    """Frames per second in meta/info.json; 0: the control rate the store records (what its env says of itself,
    kept as env.json when the episodes were recorded)."""
    names: Literal["store", "none"] = "store"
    """Dimension names of observation.state and action: those the store records (its env's own), or none."""
    vcodec: Literal["h264", "libsvtav1", "hevc"] = "h264"
    """Video encoder: h264, libsvtav1 (AV1, slower here: its fast presets drop motion in small images) or hevc."""
    crf: int = 18
    """Video quality (constant rate factor: lower is better and larger; 18 keeps every frame of 64x64 images)."""
    robot_type: str = ""
    """`robot_type` in meta/info.json; empty: null."""
    overwrite: bool = False
    """Replace an existing dataset at --out (only once the new one is complete)."""
    allow_unverified: bool = False
    """Export episodes recorded without checksums too (the export checksums what they hold now); else refused."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if not self.out:
            raise ValueError("--out is required: the directory the LeRobot dataset is written to")
        if self.fps < 0:
            raise ValueError(f"--fps must be >= 0 (0: the control rate the store records), got {self.fps}")
        if not 0 <= self.crf <= 63:
            raise ValueError(f"--crf must be within 0..63, got {self.crf}")


@command("import_lerobot", "Read a local LeRobot v3.0 dataset into a zarr store (train_policy can train on it; resumable).")
@dataclass(frozen=True)
class ImportLeRobotConfig:
    src: str = "runs/lerobot/dataset"
    """A local LeRobot v3.0 dataset directory (e.g. made by export_lerobot or by LeRobot's tools)."""
    out: str = "runs/lerobot/imported.zarr"
    """Zarr store the episodes are appended to (created if missing; episodes already in it are skipped)."""
    episodes: tuple[str, ...] = ()
    """Episodes to import, by id or episode index; none: all."""
    id_prefix: str = ""
    """Episode ids for datasets that carry none are <prefix>-e<episode_index>; empty: the directory's name."""
    allow_unverified: bool = False
    """Import a dataset without checksums (made by LeRobot's own tools) as it is; else refused."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if not self.src or not self.out:
            raise ValueError("--src (a LeRobot dataset directory) and --out (a zarr store) are required")


@command("verify_store", "Check every episode of a store against its checksums: ok, damaged (array, why) or unverified.")
@dataclass(frozen=True)
class VerifyStoreConfig:
    store: str = "runs/sim_rollout/episodes.zarr"
    """Store to check: a zarr store, a sharded store root, a LeRobot v3.0 export or a directory of .npz episodes
    (a path or file:///path). Exits 1 when anything is damaged; nothing is changed."""
    show: int = 20
    """Damaged and unverified episodes listed on the console (all of them in --json)."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if not self.store:
            raise ValueError("--store is required: the store to check")
        if self.show < 0:
            raise ValueError(f"--show must be >= 0, got {self.show}")
