"""Config dataclasses of every experiment (standard library only: the CLI stays fast).

Every field carries a docstring, which `--help` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from capsule_rollout.commands.registry import command
from capsule_rollout.commands.serve_configs import ServePolicyConfig  # noqa: F401 - serve_policy's config
from capsule_rollout.commands.store_configs import (  # noqa: F401 - the store tools' configs
    ConsolidateConfig,
    ExportLeRobotConfig,
    ImportLeRobotConfig,
    VerifyStoreConfig,
)
from capsule_rollout.commands.study_configs import RecapStudyConfig  # noqa: F401 - recap_study's config
from capsule_rollout.commands.tool_configs import ScanEnvConfig, SimRobotServerConfig  # noqa: F401
from capsule_rollout.input_bounds import check_finite, check_seeds
from capsule_rollout.learning.options import (  # noqa: F401 - the learning layer's options are commands' configs too
    ADVANTAGE,
    CAMERAS,
    FAMILIES,
    FAMILIES_OR_ALL,
    PHRASING,
    SHIPPED_POLICY,
    Acting,
    CollectDemosConfig,
    LabelAdvantagesConfig,
    Models,
    RecapConfig,
    Seeds,
    TrainCriticConfig,
    TrainPolicyConfig,
    check_noise_scale_option,
)


def check_image_size(size: int | None) -> None:
    if size is not None and not 8 <= size <= 1024:
        raise ValueError(f"--image_size must be within 8..1024 pixels, got {size}")


# the option groups' old flat names, kept for one release
MODEL_ALIASES = {"policy": "model.policy", "critic": "model.critic"}
ACT_ALIASES = {"advantage": "act.advantage", "beta": "act.beta", "n_exec": "act.n_exec"}
SEED_ALIASES = {"seed": "seeds.first", "episodes": "seeds.count"}


@command("verify_capsule", "Bit-exactness report for every capsule-bearing component (exits non-zero if any is not exact).")
@dataclass(frozen=True)
class VerifyCapsuleConfig:
    ALIASES: ClassVar[dict[str, str]] = MODEL_ALIASES

    steps: int = 8
    """Steps replayed after each restore and compared bit for bit."""
    warmup: int = 3
    """Steps run before the snapshot boundary (rounded up to the arena's alignment)."""
    seed: int = 0
    """Seed of the step inputs and of the random bytes that dirty the live buffers."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Devices to verify torch components on: auto = CPU, plus CUDA when present."""
    model: Models = Models()  # the checkpoints verified (a fresh model where a directory is missing)
    env: str = ""
    """Verify only this env (`suite:task` or `package.module:factory`): observations, rewards, the whole MjData,
    images; empty: every component of the project."""
    cameras: tuple[str, ...] | None = None
    """With --env: cameras rendered, by the env's names (a camera the MuJoCo model defines too; None: the suite's
    default camera; `--cameras` with no name: none)."""
    image_size: int = 64
    """With --env: side of the rendered images in pixels."""

    def __post_init__(self) -> None:
        check_seeds(self.seed, 1, "--seed")
        check_image_size(self.image_size)
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1 (got {self.steps})")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0 (got {self.warmup})")


@dataclass(frozen=True)
class ScoredModels:
    """A policy checkpoint, and the critics scored on its episodes."""

    policy: str = SHIPPED_POLICY
    """Policy checkpoint directory, or a factory's import path `package.module:make_policy`."""
    critic: tuple[str, ...] = ()
    """Also report these critics' failure AUC from their values at the mid-episode step (half the episode
    limit) on these episodes, each and (with more than one) their mean value's (none: no critic); checkpoint
    directories, or with --env one checkpoint or factory import path."""


@command("eval_policy", "Success rate of a policy on held-out seeds (next to the tabletop's scripted expert's).")
@dataclass(frozen=True)
class EvalPolicyConfig:
    ALIASES: ClassVar[dict[str, str]] = {**MODEL_ALIASES, **ACT_ALIASES, **SEED_ALIASES}

    model: ScoredModels = ScoredModels()
    family: FAMILIES_OR_ALL = "pick_place"
    """Task family; all: every family, each on the same seeds, with success per family."""
    env: str = ""
    """A registered env (`gymnasium:Pusher-v5`, `metaworld:pick-place-v3`...) or an import path
    `package.module:factory` evaluated instead of a tabletop family (needs --model.policy; --family, --phrasing,
    --coach and the expert comparison are the tabletop's)."""
    seeds: Seeds = Seeds(count=50)  # held out
    act: Acting = Acting()
    expert: bool = True
    """Also run the tabletop's scripted expert on the same seeds, for comparison (not with --env)."""
    actors: int = 0
    """Ray actors to play the episodes on (0: in this process); results do not depend on it."""
    slots: int = 1
    """Env slots per actor (or in this process): episodes side by side, the policy and critic batched (the
    project's policy and critic play the same episodes at any slot count; a user's that round by batch size can
    differ slightly from one slot's: `sim_rollout --check_slots` says which)."""
    phrasing: PHRASING = "canonical"
    """How the planner words each subtask: the task's own text, or one of its paraphrases that training
    may use (train) or never uses (heldout); see envs/phrasing.py."""
    coach: bool = False
    """Also the coaching evaluation (in this process) on the same seeds of each family with a place-on-a-pad
    subtask: when the policy starts placing, an operator overwrites the subtask with "place it on the <other>
    pad instead"; the share of episodes that end with the block on the coached pad."""

    cameras: tuple[str, ...] | None = None
    """Cameras rendered (with --env), by the env's names (a camera the MuJoCo model defines too); `--cameras`
    with no name: no images; unset: what the policy and critic read (the env's default camera for one that does
    not say)."""
    image_size: int | None = None
    """Side of the rendered images in pixels (unset: what the policy and critic were made for, else 64)."""

    def __post_init__(self) -> None:
        check_image_size(self.image_size)
        if (self.cameras is not None or self.image_size is not None) and not self.env:
            raise ValueError("--cameras and --image_size go with --env: the tabletop's policy reads what it was "
                             "trained on")
        if self.seeds.count < 1 or self.actors < 0 or self.slots < 1:
            raise ValueError("--seeds.count (--episodes) and --slots must be >= 1, --actors >= 0")
        if self.env:
            if self.model.policy == SHIPPED_POLICY:
                raise ValueError("--env: give the policy to evaluate (--model.policy, a checkpoint or an import "
                                 "path `package.module:make_policy`); the shipped one is the tabletop's")
            if self.coach or self.phrasing != "canonical" or self.family == "all":
                raise ValueError("--coach, --phrasing and --family all are the tabletop's: drop them with --env")
            if len(self.model.critic) > 1:
                raise ValueError("--env: score one critic at a time (--model.critic), on the host's critic lane")


@command(
    'value_ceiling',
    "How predictable failure is mid-episode: policy branches from restored capsules vs a critic's failure AUC.",
)
@dataclass(frozen=True)
class ValueCeilingConfig:
    ALIASES: ClassVar[dict[str, str]] = {**MODEL_ALIASES, **ACT_ALIASES, **SEED_ALIASES}

    model: Models = Models(critic="")  # a critic is scored on the same mid-episode states
    family: FAMILIES = "pick_place"
    """Task family."""
    env: str = ""
    """A registered env or an import path `package.module:factory` played instead of a tabletop family (needs
    --model.policy; without the tabletop, states carry no task phase)."""
    seeds: Seeds = Seeds(count=50)  # held out
    act: Acting = Acting()
    slots: int = 1
    """Env slots: the branches of a state played side by side, forks of its capsule into the slots, the policy
    batched (the project's policy and critic give the same values at any slot count)."""
    branches: int = 16
    """Continuations played from each mid-episode capsule, each with its own noise seed."""
    at_step: int | None = None
    """The control step judged (None: half the episode limit, as the critic's failure AUC elsewhere)."""
    cameras: tuple[str, ...] | None = None
    """With --env: cameras rendered, by the env's names (`--cameras` with no name: none; unset: what the policy
    and critic read)."""
    image_size: int | None = None
    """With --env: side of the rendered images in pixels (unset: what the policy was made for, else 64)."""

    def __post_init__(self) -> None:
        check_image_size(self.image_size)
        if min(self.seeds.count, self.branches, self.slots) < 1:
            raise ValueError("--seeds.count (--episodes), --branches and --slots must be >= 1")
        if self.env and self.model.policy == SHIPPED_POLICY:
            raise ValueError("--env: give the policy whose states are judged (--model.policy, a checkpoint or an "
                             "import path `package.module:make_policy`); the shipped one is the tabletop's")
        if self.at_step is not None and self.at_step < 0:
            raise ValueError(f"--at_step must be >= 0 (got {self.at_step})")


@command(
    'sim_rollout',
    "Policy + critic rollouts on Ray actors (capsule resets, hand-off), recorded to zarr; table, plot, video.",
)
@dataclass(frozen=True)
class SimRolloutConfig:
    ALIASES: ClassVar[dict[str, str]] = {**MODEL_ALIASES, **ACT_ALIASES, **SEED_ALIASES}

    actors: int = 2
    """Ray actors (rollout hosts), one process each; 0: play in this process, without Ray."""
    seeds: Seeds = Seeds(count=8)  # held out from the demonstrations; each seed played --repeats times
    family: FAMILIES_OR_ALL = "pick_place"
    """Task family; all: a mix, every family on every seed (each actor keeps a host per family), with success
    per family in the table and the plot."""
    env: str = ""
    """A registered env (`metaworld:pick-place-v3`, `gymnasium:Pusher-v5`...) or an import path
    `package.module:factory`, played instead of the tabletop family; episode ids are `<task>-s<seed>`."""
    out: str = "runs/sim_rollout"
    """Output directory (a path or file:///path): episodes.zarr, capsules/, rollout.json, rollout.png, episode.gif."""
    shards: bool = False
    """Record sharded: each actor writes its episodes to its own shard under episodes.zarr and the driver commits
    a manifest entry per episode (readers see one store; `consolidate` makes a single zarr store of it)."""
    model: Models = Models()
    act: Acting = Acting()
    value_threshold: float | None = None
    """Stop an episode when the critic's value stays below this (None: never)."""
    value_patience: int = 3
    """Consecutive low-value chunks before that stop."""
    max_steps: int | None = None
    """Control steps an episode may take at most (None: the env's own limit, which also caps this)."""
    repeats: int = 1
    """Rollouts per seed, each reset by restoring the seed's initial capsule, each with noise of its own
    (episode ids get -r1, -r2...)."""
    attempts: int = 1
    """Tries per rollout: a failed one is retried from its initial capsule (a restore) with new noise, up
    to this many times in all (ids get -a1, -a2...; each attempt is recorded)."""
    capsule_budget_mb: float | None = None
    """Memory budget of each actor's capsule store (None: unbounded); past it, least recently used
    capsules are dropped and read back from capsules/ when needed."""
    pin_seeds: tuple[int, ...] = ()
    """Seeds whose initial capsules stay pinned in every actor's store (a fixed evaluation set)."""
    episode_timeout_s: float | None = None
    """None (the default): deadlines per phase (cold reset, restore, chunk, step...), each 3 x the longest time
    the actors measured for it, at least --deadline_floor_s; a phase's first occurrence in a process at most
    --first_call_s, and a phase never measured that (rollout/deadlines.py). A number: seconds an episode may run
    instead. 0: no deadline (a warning); infinity is refused (0 says it). A hung episode's actor is killed and
    restarted and the episode re-run; one that hangs at the same place twice is lost (the run goes on)."""
    first_call_s: float = 600.0
    """The first-call allowance: the deadline of a phase no actor has measured yet, and the most a phase's first
    occurrence in a process (a first compile) may take, whatever was measured."""
    deadline_floor_s: float = 30.0
    """The shortest deadline of a phase (a GC pause or a slow disk is no hang)."""
    lanes: Literal["auto", "two", "serial"] = "auto"
    """Policy and critic on two lanes at once, or one after the other; auto: two on a GPU or with 2+ cores for
    torch, else one after the other (what is played is the same)."""
    cpus_per_actor: float = 1.0
    """Ray CPU resources per actor."""
    gpus_per_actor: float = 0.0
    """Ray GPU fraction per actor (the policy and critic then run on CUDA)."""
    max_restarts: int = 3
    """Restarts an actor gets after it dies on its own (a crash; a kill for a hang does not count); past them it is
    gone, and with no actor left the run gives up (the summary says why, every episode left lost)."""
    episodes_per_call: int = 1
    """Episodes handed to an actor in one Ray call (their reports come back together): more than 1 spreads
    the driver's per-call cost over several episodes, for short episodes on many actors; an actor that dies
    has every episode of its call re-run. With --slots, at least 4 per slot."""
    slots: int = 1
    """Env slots per actor: episodes played side by side in one process, their policy and critic calls batched
    into one per round (rollout/slots/host.py). The project's policy and critic are batch-invariant, so
    their episodes are the same at any slot count; a user's policy or critic may round by batch size
    (`--check_slots` says), so a run resumes with the slots it was made with, and replays with them unless
    `replay --slots` says otherwise."""
    batch_invariant: bool = True
    """The project's policy and critic batch-invariant: an episode the same at any --slots (a row gets what a
    batch of one gives it). false: the network over the batch as it is, a host of one slot about 1.3x faster with
    the shipped policy, episodes that change with --slots (BENCHMARKS "Env slots")."""
    check_slots: bool = False
    """Before the run, play the first seed's first 3 chunks at 1 slot and in the last of --slots (the others busy)
    and say whether they are the same bit for bit (the summary's `slot_check`): whether the episodes depend on
    --slots. Costs two hosts built in this process."""
    env_threads: int = 1
    """Threads stepping each actor's slots between batched calls (MuJoCo steps without the GIL): for actors
    given several CPUs (--cpus_per_actor). Does not change what is played."""
    pin_cores: bool = False
    """Pin actor i to CPU core i (one core per host, both lanes included)."""
    video: bool = True
    """Write a gif of one episode (the first success, else the first)."""
    progress: bool = True
    """Show a progress bar."""
    observers: tuple[str, ...] = ()
    """Episode observers built in every actor, each `package.module:factory` or `package.module:factory={JSON
    kwargs}` (called as factory(**kwargs); its hooks: rollout.observer.EpisodeObserver)."""

    cameras: tuple[str, ...] | None = None
    """Cameras rendered (and recorded), by the env's names (a camera the MuJoCo model defines too); `--cameras`
    with no name: no images; unset: what the policy and critic read (the env's default camera for one that does
    not say)."""
    image_size: int | None = None
    """Side of the rendered images in pixels (unset: what the policy and critic were made for, else 64)."""

    def __post_init__(self) -> None:
        check_image_size(self.image_size)
        if self.actors < 0 or self.seeds.count < 1 or self.value_patience < 1:
            raise ValueError("--actors must be >= 0; --seeds.count (--episodes) and --value_patience >= 1")
        if self.repeats < 1 or self.attempts < 1:
            raise ValueError(f"--repeats and --attempts must be >= 1 (got {self.repeats}, {self.attempts})")
        if self.episodes_per_call < 1 or self.slots < 1 or self.env_threads < 1:
            raise ValueError(f"--episodes_per_call, --slots and --env_threads must be >= 1 (got "
                             f"{self.episodes_per_call}, {self.slots}, {self.env_threads})")
        check_finite(self.value_threshold, "--value_threshold", "none: no low-value stop")
        check_finite(self.episode_timeout_s, "--episode_timeout_s", "0: no deadline; none: derived per phase")
        check_finite(self.capsule_budget_mb, "--capsule_budget_mb", "none: unbounded")
        if self.episode_timeout_s is not None and not self.episode_timeout_s >= 0:
            raise ValueError(f"--episode_timeout_s must be >= 0 (0: no deadline; none: derived), "
                             f"got {self.episode_timeout_s}")
        if self.capsule_budget_mb is not None and self.capsule_budget_mb < 0:
            raise ValueError(f"--capsule_budget_mb must be >= 0 (got {self.capsule_budget_mb})")
        for name in ("first_call_s", "deadline_floor_s"):
            value = getattr(self, name)
            check_finite(value, f"--{name}")
            if not value > 0:
                raise ValueError(f"--{name} must be > 0 (got {value})")
        if self.deadline_floor_s > self.first_call_s:
            raise ValueError(f"--deadline_floor_s ({self.deadline_floor_s}) exceeds --first_call_s "
                             f"({self.first_call_s}): lower the floor or raise the allowance")
        if self.max_restarts < 0 or (self.max_steps is not None and self.max_steps < 1):
            raise ValueError(f"--max_restarts must be >= 0 and --max_steps >= 1 (got {self.max_restarts}, "
                             f"{self.max_steps})")
        for seed in self.pin_seeds:
            check_seeds(seed, 1, "--pin_seeds")

    @property
    def episodes_at_most(self) -> int:
        """Episodes the run plays at most: every seed (of every family with --family all), each repeat, each
        attempt."""
        families = 4 if self.family == "all" and not self.env else 1  # tabletop.tasks.FAMILY_NAMES
        return self.seeds.count * families * self.repeats * self.attempts


@command(
    'replay',
    "Re-run a recorded episode from its initial capsule; exits non-zero unless actions and values are bit-identical.",
)
@dataclass(frozen=True)
class ReplayConfig:
    store: str = "runs/sim_rollout/episodes.zarr"
    """Zarr store written by sim_rollout (its directory holds rollout.json and capsules/)."""
    episode: str = ""
    """Episode id to re-run (e.g. pick_place-s1000000)."""
    capsules: str = ""
    """Directory of initial capsules; empty: `capsules/` next to the store."""
    trust: bool = False
    """Replay a capsule that is not signed with this user's key (one from elsewhere) as data: its state restores
    only where it is data or what the env built here holds already, and no code its run names is called (give
    --env, --policy or --critic yourself). See the trust levels in docs/how-to/sharing-capsules.md."""
    trust_code: bool = False
    """Replay a capsule not signed with this user's key as code: as powerful as pickle (the state may install
    objects and methods the env then calls, the run's factories and observers are called). Only for files you
    would run as code."""
    env: str = ""
    """The env to replay on, over the one the run names (empty: the run's, from the spec signed in the capsule)."""
    policy: str = ""
    """The policy source, over the run's (empty: the run's)."""
    critic: str = ""
    """The critic source, over the run's (empty: the run's)."""
    slots: int | None = None
    """Replay on a host of this many slots (None: the run's). The project's policy and critic play the same
    episode at any slot count; a policy or critic that rounds by batch size replays exactly only with the run's
    (`sim_rollout --check_slots`)."""


@command("export_checkpoint", "Copy a policy or critic checkpoint without optimizer state (the form that is shipped).")
@dataclass(frozen=True)
class ExportCheckpointConfig:
    src: str = ""
    """Checkpoint directory to export (e.g. a training run's --out)."""
    out: str = ""
    """Destination: weights and JSON only, no optimizer state (what is shipped)."""
    eval: str = ""
    """Optional JSON summary of eval_policy to record in the checkpoint's info."""
    n_exec: int | None = None
    """Record the receding horizon the policy is deployed with (actions of each chunk executed): what
    `--act.n_exec` defaults to for it. None: the source's record, if any (else commands use 8)."""
    noise_scale: float | None = None
    """Record the scale of the policy noise it is deployed with: what `--act.noise_scale` defaults to for it.
    None: the source's record, if any (else 1)."""

    def __post_init__(self) -> None:
        if self.n_exec is not None and self.n_exec < 1:
            raise ValueError(f"--n_exec must be >= 1 (got {self.n_exec})")
        check_noise_scale_option(self.noise_scale, "--noise_scale")


@dataclass(frozen=True)
class RobotAddress:
    """Where the robot server listens, and the token it asks for."""

    host: str = "127.0.0.1"
    """Robot server address."""
    port: int = 0
    """Robot server port (required)."""
    token: str = ""
    """Shared token (required by servers bound beyond loopback)."""


@command(
    'real_recap',
    "RECAP rollouts on a robot through the bridge: operator END labels, takeover, coaching, e-stop; npz + zarr.",
)
@dataclass(frozen=True)
class RealRecapConfig:
    ALIASES: ClassVar[dict[str, str]] = {**MODEL_ALIASES, **ACT_ALIASES}

    robot: RobotAddress = RobotAddress()  # --robot.host, --robot.port, --robot.token
    episodes: int = 1
    """Episodes to run."""
    seed: int | None = None
    """First seed passed to the robot's reset (a sim robot uses it; a real one may ignore it)."""
    out: str = "runs/real_recap"
    """Output directory: episodes.zarr and npz/ (one .npz per episode)."""
    model: Models = Models()
    act: Acting = Acting()
    value_threshold: float | None = None
    """Stop when the critic's value stays below this for --value_patience chunks (None: never)."""
    value_patience: int = 3
    """Consecutive low-value chunks before that stop."""
    max_steps: int = 80
    """Timeout in control steps."""
    operator: Literal["keyboard", "script", "none"] = "keyboard"
    """Operator input: the terminal's keys, a --script, or none."""
    script: tuple[str, ...] = ()
    """Scripted operator events STEP:KIND[:TEXT], KIND in end_success end_failure takeover_on takeover_off coach estop."""
    teleop: bool = True
    """During a takeover, act with the robot side's teleoperation device (the scripted expert of a sim robot)."""

    def __post_init__(self) -> None:
        check_finite(self.value_threshold, "--value_threshold", "none: no low-value stop")
        if self.seed is not None:
            check_seeds(self.seed, self.episodes, "--seed", "--episodes")
        if self.robot.port < 0:
            raise ValueError(f"--robot.port must be a port number, got {self.robot.port}")
        if self.episodes < 1 or self.max_steps < 1:
            raise ValueError("--episodes and --max_steps must be >= 1")
        if self.operator == "script" and not self.script:
            raise ValueError("--operator script needs --script STEP:KIND[:TEXT] ...")


@command("train_state_policy", "behaviour-clone a small state -> action-chunk network into a TorchPolicy checkpoint")
@dataclass(frozen=True)
class TrainStatePolicyConfig:
    data: str = "runs/demos/metaworld.zarr"
    """Zarr store of demonstrations (`state`, `action`)."""
    out: str = "runs/state_policy"
    """Checkpoint directory written (a TorchPolicy checkpoint)."""
    ALIASES: ClassVar[dict[str, str]] = {"horizon": "chunk_length"}  # old name
    chunk_length: int = 8
    """Actions per predicted chunk."""
    hidden: int = 256
    """Hidden width of the MLP (3 layers)."""
    steps: int = 20000
    """Optimizer steps."""
    batch: int = 256
    """Examples per step."""
    lr: float = 1e-3
    """AdamW learning rate (cosine decay to 0)."""
    successes_only: bool = True
    """Train on successful episodes only."""
    seed: int = 0
    """Seed of the initialisation and batch sampling."""
    threads: int = 1
    """torch threads (a small network trains fastest on one, and far faster than on two busy cores)."""

    def __post_init__(self) -> None:
        check_seeds(self.seed, 1, "--seed")
        if min(self.chunk_length, self.hidden, self.steps, self.batch) < 1 or not self.lr > 0:
            raise ValueError("--chunk_length, --hidden, --steps, --batch must be >= 1 and --lr > 0")


# the learning layer's options, registered as commands here (learning/ knows nothing of the command line)
_LEARNING_COMMANDS = {
    "collect_demos": (CollectDemosConfig,
                      "Scripted-expert demonstrations to a zarr store or .npz files (resumable)."),
    "train_policy": (TrainPolicyConfig,
                     "Train the flow policy on recorded episodes (resumable; closed-loop evaluation on held-out "
                     "seeds)."),
    "train_critic": (TrainCriticConfig, "Train the distributional value critic on recorded episodes (resumable)."),
    "label_advantages": (LabelAdvantagesConfig,
                         "RECAP advantage labels (N-step, per-task thresholds, interventions positive) as a sidecar "
                         "next to a store."),
    "recap": (RecapConfig,
              "The RECAP loop in sim: BC baseline, then rollouts with takeovers, critic, advantage labels, "
              "conditioned policy."),
}
for _name, (_config, _summary) in _LEARNING_COMMANDS.items():
    command(_name, _summary)(_config)
