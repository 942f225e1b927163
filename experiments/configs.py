"""Config dataclasses of every experiment (standard library only: the CLI stays fast).

Every field carries a docstring, which `--help` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FAMILIES = Literal["pick_place", "stack", "arrange", "sort"]  # envs.tasks.FAMILY_NAMES
CAMERAS = ("front", "top")  # envs.tabletop_env.CAMERAS


@dataclass(frozen=True)
class VerifyCapsuleConfig:
    steps: int = 8
    """Steps replayed after each restore and compared bit for bit."""
    warmup: int = 3
    """Steps run before the snapshot boundary (rounded up to the arena's alignment)."""
    seed: int = 0
    """Seed of the step inputs and of the random bytes that dirty the live buffers."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Devices to verify torch components on: auto = CPU, plus CUDA when present."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1 (got {self.steps})")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0 (got {self.warmup})")


@dataclass(frozen=True)
class BenchCapsulesConfig:
    sizes_kib: tuple[int, ...] = (4, 1024, 65536)
    """Capsule sizes to measure, in KiB (4 KiB, 1 MiB, 64 MiB by default)."""
    buffers: tuple[int, ...] = (16, 64, 256)
    """Number of state buffers each capsule is split into (one per size)."""
    rounds: int = 300
    """Timed rounds per size; each round times every method once, side by side."""
    max_seconds_per_size: float = 20.0
    """Stop a size's rounds early once this much time has passed."""
    disk_rounds: int = 5
    """Rounds of the disk save/load measurement per size."""
    quick: bool = False
    """Fewer rounds (for `make demo`): 40 rounds, 2 disk rounds."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the capsule's buffers live: auto = CUDA when present, else CPU."""
    disk_dir: str = ""
    """Directory for the disk measurement; empty means a fresh temporary directory."""
    docs: str = ""
    """Markdown file whose bench_capsules section is replaced by the results (e.g. docs/BENCHMARKS.md); empty: none."""
    seed: int = 0
    """Seed of the buffer sizes and contents."""

    def __post_init__(self) -> None:
        if len(self.sizes_kib) != len(self.buffers):
            raise ValueError(
                f"--sizes_kib has {len(self.sizes_kib)} values but --buffers has {len(self.buffers)}: give one buffer count per size"
            )
        for size, n in zip(self.sizes_kib, self.buffers):
            if size < 1 or n < 1:
                raise ValueError("--sizes_kib and --buffers must be positive")
            if n * 64 > size * 1024:
                raise ValueError(f"{n} buffers do not fit {size} KiB with 64-byte buffers; use fewer --buffers")
        if self.rounds < 3 or self.disk_rounds < 1:
            raise ValueError("--rounds must be >= 3 and --disk_rounds >= 1")


@dataclass(frozen=True)
class CollectDemosConfig:
    episodes: int = 100
    """Episodes to collect (seeds `seed` .. `seed + episodes - 1`)."""
    out: str = "runs/demos/pick_place.zarr"
    """Output: a zarr store (appended to; seeds already in it are skipped) or an .npz directory."""
    format: Literal["zarr", "npz"] = "zarr"
    """zarr: one store, diffusion_policy layout; npz: one file per episode."""
    family: FAMILIES = "pick_place"
    """Task family."""
    noise: float = 0.0
    """Expert degradation, 0 (perfect) .. 1 (poor): random motions and suction drop-outs."""
    seed: int = 0
    """First episode seed."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras recorded (front, top); none for state-only episodes."""
    image_size: int = 64
    """Square image size in pixels."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1 (got {self.episodes})")
        if not 0.0 <= self.noise <= 2.0:
            raise ValueError(f"--noise must be within 0..2 (got {self.noise})")
        bad = [c for c in self.cameras if c not in CAMERAS]
        if bad:
            raise ValueError(f"--cameras {bad} unknown; choose from {list(CAMERAS)}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0 (got {self.seed})")


@dataclass(frozen=True)
class BenchEnvConfig:
    family: FAMILIES = "pick_place"
    """Task family measured."""
    image_size: int = 64
    """Square camera image size for the rendered measurements."""
    step_blocks: int = 30
    """Interleaved blocks of 100 control steps for each stepping mode."""
    resets: int = 300
    """Interleaved rounds of reset(seed) vs capsule restore."""
    episodes: int = 30
    """Expert episodes recorded for the recorder measurements."""
    quick: bool = False
    """Fewer rounds (a smoke run)."""
    docs: str = ""
    """Markdown file whose bench_env section is replaced by the results; empty: none."""
    out_dir: str = ""
    """Directory for the recorder measurements; empty means a fresh temporary directory."""

    def __post_init__(self) -> None:
        if min(self.step_blocks, self.resets, self.episodes) < 2:
            raise ValueError("--step_blocks, --resets and --episodes must be >= 2")
