"""Config dataclasses of the benchmarks (standard library only: the CLI stays fast).

Every field carries a docstring, which `--help` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from capsule_rollout.commands.registry import command
from capsule_rollout.learning.options import FAMILIES


@command("bench_capsules", "Snapshot/restore latency vs a contiguous copy of the same bytes; disk save/load MB/s.")
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
                f"--sizes_kib has {len(self.sizes_kib)} values but --buffers has {len(self.buffers)}: "
                "give one buffer count per size"
            )
        for size, n in zip(self.sizes_kib, self.buffers):
            if size < 1 or n < 1:
                raise ValueError("--sizes_kib and --buffers must be positive")
            if n * 64 > size * 1024:
                raise ValueError(f"{n} buffers do not fit {size} KiB with 64-byte buffers; use fewer --buffers")
        if self.rounds < 3 or self.disk_rounds < 1:
            raise ValueError("--rounds must be >= 3 and --disk_rounds >= 1")


@command("bench_env", "Env steps/s (state-only, rendered), reset(seed) vs capsule restore, recorder MB/s and caller wait.")
@dataclass(frozen=True)
class BenchEnvConfig:
    family: FAMILIES = "pick_place"
    """Task family measured."""
    env: tuple[str, ...] = ()
    """Suite envs to measure instead (`reset(seed)` vs capsule restore, capsule bytes, steps/s), e.g.
    gymnasium:Ant-v5 metaworld:pick-place-v3; `--docs` then writes the bench_suite_envs section."""
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
    section: str = ""
    """With --env: a name appended to the docs section's (one per mujoco version), so that several sets of
    envs keep tables of their own."""
    out_dir: str = ""
    """Directory for the recorder measurements; empty means a fresh temporary directory."""

    def __post_init__(self) -> None:
        if min(self.step_blocks, self.resets, self.episodes) < 2:
            raise ValueError("--step_blocks, --resets and --episodes must be >= 2")


@command("bench_policy", "Policy and critic latency per chunk, serial vs two-lane, captured vs eager on a GPU.")
@dataclass(frozen=True)
class BenchPolicyConfig:
    policy: str = "experiments/checkpoints/policy"
    """Policy checkpoint (a fresh model of the default size when the directory is missing)."""
    critic: str = "experiments/checkpoints/critic"
    """Critic checkpoint (likewise)."""
    rounds: int = 300
    """Interleaved rounds; each times every method once."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when present, else CPU."""
    threads: tuple[int, ...] = (1, 2)
    """CPU only: torch thread counts to measure (each a separate table row)."""
    quick: bool = False
    """Few rounds (a smoke run)."""
    docs: str = ""
    """Markdown file whose bench_policy section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 3:
            raise ValueError("--rounds must be >= 3")
        if not self.threads or min(self.threads) < 1:
            raise ValueError("--threads needs one or more positive counts")


@command("bench_rollout", "Reset by capsule restore vs cold, recording on vs off, 1 vs 2 actors, hand-off latency.")
@dataclass(frozen=True)
class BenchRolloutConfig:
    policy: str = "experiments/checkpoints/policy"
    """Policy checkpoint."""
    critic: str = "experiments/checkpoints/critic"
    """Critic checkpoint."""
    family: FAMILIES = "pick_place"
    """Task family."""
    seed: int = 1_000_000
    """First seed used."""
    n_exec: int = 8
    """Actions per chunk executed."""
    max_steps: int = 40
    """Episode length cap (keeps rounds comparable and short)."""
    reset_rounds: int = 50
    """Capsule-restore resets timed."""
    cold_rounds: int = 5
    """Cold resets timed (interleaved with the restores)."""
    record_rounds: int = 6
    """Episode pairs with recording on and off."""
    loop_episodes: int = 4
    """Episodes (seeds) per mode and round of the loop-overhead measurement."""
    loop_rounds: int = 15
    """Paired rounds of host (serial lanes, two lanes) vs hand-written loop."""
    scale_episodes: int = 8
    """Episodes per throughput measurement (1 vs 2 actors)."""
    handoff_samples: int = 500
    """Hand-offs timed per mode."""
    actors_check: bool = True
    """Measure 1 vs 2 Ray actors (starts Ray)."""
    docs: str = ""
    """Markdown file whose bench_rollout section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if min(self.reset_rounds, self.cold_rounds, self.record_rounds, self.scale_episodes, self.loop_episodes,
               self.loop_rounds) < 1:
            raise ValueError("round and episode counts must be >= 1")
        if self.handoff_samples < 10:
            raise ValueError("--handoff_samples must be >= 10")


@command("bench_slots", "Env slots: steps/s of 8 slots in one actor vs 1 slot, and RECAP branch collection with forks in "
                       "the batch vs one continuation at a time, on one core.")
@dataclass(frozen=True)
class BenchSlotsConfig:
    policy: str = "experiments/checkpoints/policy"
    """Policy checkpoint."""
    critic: str = "experiments/checkpoints/critic"
    """Critic checkpoint."""
    family: FAMILIES = "pick_place"
    """Task family."""
    slots: int = 8
    """Slots of the batched host (against a host of one slot)."""
    n_exec: int | None = None
    """Actions per chunk executed (None: as the policy checkpoint records, else 8)."""
    seed: int = 1_000_000
    """First seed used."""
    episodes: int = 32
    """Episodes (seeds) per mode and round of the rollout measurement."""
    max_steps: int = 80
    """Episode length cap."""
    rounds: int = 5
    """Paired rounds (order shuffled per round)."""
    branch_items: int = 2
    """Recorded episodes branched per round of the branch measurement (each played again, then branched)."""
    branch_steps: tuple[int, ...] = (2, 6, 10)
    """Chunk starts branched from."""
    branches: int = 8
    """Continuations per boundary."""
    docs: str = ""
    """Markdown file whose bench_slots section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.slots < 2 or min(self.episodes, self.rounds, self.branch_items, self.branches) < 1:
            raise ValueError("--slots must be >= 2; --episodes, --rounds, --branch_items, --branches >= 1")


@command("bench_slot_memory", "Env slots and a large policy: an actor's memory with N slots vs one, one batched infer "
         "object per actor against an instance per slot.")
@dataclass(frozen=True)
class BenchSlotMemoryConfig:
    slots: int = 8
    """Slots of the batched host (against a host of one slot)."""
    weights_mb: int = 200
    """Weights the policy object holds (a read-only array: taken by reference, never copied into a capsule)."""
    episodes: int = 8
    """Episodes played in each layout before its memory is read."""
    rounds: int = 3
    """Times each layout is measured (fresh processes, alternated); medians."""
    docs: str = ""
    """Markdown file whose bench_slot_memory section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.slots < 2 or min(self.weights_mb, self.episodes, self.rounds) < 1:
            raise ValueError("--slots must be >= 2; --weights_mb, --episodes and --rounds >= 1")


@command(
    'bench_bridge',
    "Robot bridge round-trip latency on loopback (heartbeat, action, observe) against the SimRobotServer.",
)
@dataclass(frozen=True)
class BenchBridgeConfig:
    rounds: int = 500
    """Interleaved rounds; each times every request kind once."""
    image_size: int = 64
    """Camera image size served by the sim robot."""
    docs: str = ""
    """Markdown file whose bench_bridge section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 10:
            raise ValueError("--rounds must be >= 10")


@command(
    'bench_lerobot_bridge',
    "In LeRobot's venv: a control step over the bridge to a LeRobot robot (the robot side's command in a process of "
    "its own) against the robot's own calls and its control period.",
)
@dataclass(frozen=True)
class BenchLeRobotBridgeConfig:
    robot_type: str = "so101_sim"
    """LeRobot robot type (`--robot.type`; default: the SO-101 follower in MuJoCo, examples/lerobot_so101_sim)."""
    plugin: str = "examples.lerobot_so101_sim"
    """Package that registers that type with LeRobot (`--robot.discover_packages_path`; empty: none)."""
    robot_id: str = "bench"
    """The robot's id, which names its calibration (`--robot.id`)."""
    calibration_dir: str = "runs/bench/calibration"
    """Where LeRobot keeps that calibration (empty: LeRobot's own place)."""
    camera_sizes: tuple[int, ...] = (0, 64)
    """Square sizes of one `front` camera of type `mujoco` (the sim's), one measurement each (0: no camera)."""
    fps: int = 30
    """The cameras' fps, and so the control rate."""
    steps: int = 300
    """Control steps timed per measurement (the first 10 left out)."""
    docs: str = ""
    """Markdown file whose bench_lerobot_bridge section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.steps < 20 or self.fps < 1:
            raise ValueError("--steps must be >= 20 and --fps >= 1")


@command("bench_lerobot", "LeRobot export and import speed (frames/s) with and without video, and the dataset's size.")
@dataclass(frozen=True)
class BenchLeRobotConfig:
    store: str = "runs/bench/demos200.zarr"
    """Zarr store exported (make one: collect_demos --episodes 200 --out runs/bench/demos200.zarr)."""
    rounds: int = 3
    """Interleaved rounds; each exports (and imports) once per method, in shuffled order."""
    vcodecs: tuple[str, ...] = ("h264", "libsvtav1")
    """Video encoders measured beside the export without video."""
    svt_presets: tuple[int, ...] = ()
    """More libsvtav1 speed presets to measure (at the default crf), beside the default 6 and LeRobot's 12."""
    docs: str = ""
    """Markdown file whose bench_lerobot section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {self.rounds}")
        if any(not 0 <= p <= 13 for p in self.svt_presets):
            raise ValueError(f"--svt_presets must be within 0..13, got {list(self.svt_presets)}")
        bad = [c for c in self.vcodecs if c not in ("h264", "libsvtav1", "hevc")]
        if bad:
            raise ValueError(f"--vcodecs {bad} unknown; choose from h264, libsvtav1, hevc")


@command("bench_lerobot_policy", "A LeRobot policy (ACT, Diffusion) through the adapter vs its network called "
                                "directly (per network call and per step), and env slots' steps/s with it; run it "
                                "where LeRobot is installed (make lerobot-venv).")
@dataclass(frozen=True)
class BenchLeRobotPolicyConfig:
    policies: tuple[str, ...] = ()
    """LeRobot policy directories (`<lerobot-train output>/checkpoints/last/pretrained_model`), each measured."""
    rounds: int = 5
    """Interleaved rounds of the latency measure (order shuffled per round), and paired rounds of steps/s."""
    calls: int = 10
    """Network calls timed per method and round (each followed by the steps its queued actions serve)."""
    slots: int = 4
    """Slots of the batched host (against a host of one slot)."""
    episodes: int = 8
    """Episodes (seeds) per host and round of the steps/s measure."""
    max_steps: int = 40
    """Episode length cap of the steps/s measure."""
    seed: int = 1_000_000
    """First seed of the steps/s measure."""
    docs: str = ""
    """Markdown file whose bench_lerobot_policy section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if min(self.rounds, self.calls, self.episodes, self.max_steps) < 1 or self.slots < 2:
            raise ValueError("--rounds, --calls, --episodes and --max_steps must be >= 1, --slots >= 2")


@command("bench_recording", "Recording throughput with synthetic actors: single writer vs sharded, 1-8 actors.")
@dataclass(frozen=True)
class BenchRecordingConfig:
    actors: tuple[int, ...] = (1, 2, 4, 8)
    """Synthetic actor counts measured (each with the single-writer store and with a sharded one)."""
    episodes: int = 200
    """Episodes recorded per measurement."""
    rounds: int = 3
    """Rounds; each measures every (actors, store) pair once, the two stores back to back (which goes first
    alternates by round). Figures are medians over rounds; the CPU ratio is the median of the rounds' ratios."""
    steps: int = 80
    """Control steps per synthetic episode."""
    image_size: int = 64
    """Camera image side, in pixels."""
    cameras: int = 1
    """Cameras per step."""
    cpus_per_actor: float = 0.25
    """Ray CPU resources per synthetic actor (8 actors at 0.25 fit a 2-core machine)."""
    episodes_per_call: tuple[int, ...] = (1, 8)
    """Episodes per Ray call measured (`run_rollouts(episodes_per_call=...)`; sharded, an actor commits a call's
    episodes to its shard at once), each with both stores."""
    out: str = ""
    """Directory the measured stores are written to (each removed after its measurement); empty: a temp directory."""

    def __post_init__(self) -> None:
        if not self.actors or min(self.actors) < 1:
            raise ValueError(f"--actors must be counts >= 1, got {list(self.actors)}")
        if self.episodes < 2 or self.steps < 1 or self.image_size < 1 or self.cameras < 0 or self.rounds < 1:
            raise ValueError("--episodes must be >= 2, --steps, --image_size and --rounds >= 1, --cameras >= 0")
        if not self.cpus_per_actor > 0:
            raise ValueError(f"--cpus_per_actor must be > 0, got {self.cpus_per_actor}")
        if not self.episodes_per_call or min(self.episodes_per_call) < 1:
            raise ValueError(f"--episodes_per_call must be counts >= 1, got {list(self.episodes_per_call)}")


@command("bench_checksums", "What the stores' checksums cost: recording steps/s and read MB/s with and without them.")
@dataclass(frozen=True)
class BenchChecksumsConfig:
    episodes: int = 40
    """Episodes recorded per measurement (one `write` each, as a driver does; timed to the recorder's close)."""
    steps: int = 100
    """Control steps per synthetic episode."""
    image_size: int = 64
    """Camera image side, in pixels."""
    cameras: int = 2
    """Cameras per step."""
    images: tuple[str, ...] = ("random", "smooth")
    """Image kinds measured: random bytes (incompressible: the least work per byte besides the checksum, its
    worst case) and smooth gradients that move (compress like renders)."""
    rounds: int = 7
    """Rounds; each records with and without checksums and reads with and without verifying, back to back (which
    goes first alternates by round). Figures are medians over rounds, ratios medians of the rounds' ratios."""
    read_repeats: int = 3
    """Reads of each kind per round, interleaved; the fastest counts (the least disturbed by other work)."""
    out: str = ""
    """Directory the measured stores are written to (removed at the end); empty: a temp directory."""

    def __post_init__(self) -> None:
        if min(self.episodes, self.steps, self.image_size, self.rounds, self.read_repeats) < 1 or self.cameras < 0:
            raise ValueError("--episodes, --steps, --image_size, --rounds and --read_repeats must be >= 1, "
                             "--cameras >= 0")
        bad = [kind for kind in self.images if kind not in ("random", "smooth")]
        if bad or not self.images:
            raise ValueError(f"--images must name random and/or smooth, got {list(self.images)}")


@command("bench_remote_policy", "Per-chunk latency of a policy in process vs served over openpi's websocket protocol.")
@dataclass(frozen=True)
class BenchRemotePolicyConfig:
    policy: str = "experiments/checkpoints/policy"
    """Policy checkpoint or factory import path served and measured."""
    env: str = ""
    """The env it acts in (sizes it; gives the observation); empty: the tabletop --family."""
    family: FAMILIES = "pick_place"
    """Tabletop family (without --env)."""
    rounds: int = 500
    """Interleaved rounds; each times one chunk in process and one over the websocket."""
    threads: int = 1
    """torch threads of the policy, in process and in the server."""
    docs: str = ""
    """Markdown file whose bench_remote_policy section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if self.rounds < 3 or self.threads < 1:
            raise ValueError("--rounds must be >= 3 and --threads >= 1")


@command("bench_tasks", "A mix of tasks on slots: `sim_rollout --family all` against one family (the same episode count, "
                        "actors and slots), rows filled per call, start-up, and steps/s over the env alone.")
@dataclass(frozen=True)
class BenchTasksConfig:
    policy: str = "experiments/checkpoints/policy"
    """Policy checkpoint."""
    critic: str = "experiments/checkpoints/critic"
    """Critic checkpoint."""
    family: FAMILIES = "pick_place"
    """The one family the mix is measured against."""
    n_exec: int | None = None
    """Actions per chunk executed (None: as the policy checkpoint records)."""
    actors: int = 2
    """Ray actors of each run."""
    slots: int = 4
    """Env slots per actor."""
    seeds: int = 32
    """Seeds of every family in the mix (the one-family run plays 4x as many seeds: the same episode count)."""
    rounds: int = 2
    """Paired rounds (the mix and the one family, in turn)."""
    episodes_per_call: tuple[int, ...] = (0, 64)
    """The mix's runs also measured with these `--episodes_per_call` (0: the default, 4 per slot)."""
    startup_rounds: int = 3
    """Paired rounds of a one-seed run (mostly start-up), this checkout and `--before`'s."""
    before: str = ""
    """A checkout of an earlier version (its package directory's parent) whose one-seed runs are timed beside this
    one's; empty: none."""
    out: str = "runs/bench/tasks"
    """Where the runs are written (each run's directory made afresh)."""
    docs: str = ""
    """Markdown file whose bench_tasks section is replaced by the results; empty: none."""

    def __post_init__(self) -> None:
        if min(self.actors, self.slots, self.seeds, self.rounds, self.startup_rounds) < 1:
            raise ValueError("--actors, --slots, --seeds, --rounds and --startup_rounds must be >= 1")
        if any(k < 0 for k in self.episodes_per_call):
            raise ValueError("--episodes_per_call values must be >= 0 (0: the default)")
