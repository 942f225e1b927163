"""Options of the learning layer's functions (standard library only: the command line imports them to
build its `--help`, and stays fast). Every field carries a docstring, which `--help` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from capsule_rollout.input_bounds import check_seeds
from capsule_rollout.rollout.run_options import (  # noqa: F401 - the command line's `--act.*` and its checks
    ADVANTAGE,
    Acting,
    check_noise_scale_option,
)

FAMILIES = Literal["pick_place", "stack", "arrange", "sort"]  # tabletop.tasks.FAMILY_NAMES
FAMILIES_OR_ALL = Literal["pick_place", "stack", "arrange", "sort", "all"]  # "all": every family, each on the seeds
PHRASING = Literal["canonical", "train", "heldout"]  # tabletop.phrasing.PHRASINGS
CAMERAS = ("front", "top")  # tabletop.tabletop_env.CAMERAS
SHIPPED_POLICY = "checkpoints/policy"
SHIPPED_CRITIC = "checkpoints/critic"

# Option groups: fields that several commands share, one dataclass each. A config holds a group as a field
# and the command line spells its options dotted (`--seeds.count`); `ALIASES` keep the old flat names.


@dataclass(frozen=True)
class Seeds:
    """A block of consecutive episode seeds, one episode each."""

    first: int = 1_000_000
    """First seed (the held-out block starts at 1000000; demonstrations use small seeds)."""
    count: int = 50
    """Seeds, one episode each: `first` .. `first + count - 1`."""

    def __post_init__(self) -> None:
        if self.first < 0 or self.count < 0:
            raise ValueError(f"first and count must be >= 0 (got {self.first}, {self.count})")
        check_seeds(self.first, self.count, "first", "count")

    @property
    def range(self) -> range:
        return range(self.first, self.first + self.count)


@dataclass(frozen=True)
class Models:
    """The checkpoints a command loads."""

    policy: str = SHIPPED_POLICY
    """Policy checkpoint directory, or a factory's import path `package.module:make_policy` (on an --env that is
    not the tabletop, give one: the shipped policy acts in the tabletop only)."""
    critic: str = SHIPPED_CRITIC
    """Critic checkpoint directory or factory import path; empty: no critic (values NaN, no low-value stop). The
    shipped critic values the tabletop only: with an --env, the default is no critic."""


@dataclass(frozen=True)
class Loop:
    """The optimizer loop of a training run and its checkpoints."""

    steps: int = 20000
    """Optimizer steps in total (a resumed run continues up to this)."""
    batch_size: int = 64
    """Examples per step."""
    lr: float = 3e-4
    """Peak learning rate (AdamW, warm-up then cosine decay)."""
    eval_every: int = 2000
    """Steps between evaluations."""
    checkpoint_every: int = 1000
    """Steps between checkpoints."""
    seed: int = 0
    """Seed of initialisation, batches and augmentation."""
    resume: bool = True
    """Continue from the checkpoint in --out if there is one (False: refuse to touch it)."""
    threads: int = 0
    """torch CPU threads (0: torch's default)."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if min(self.steps, self.batch_size, self.eval_every, self.checkpoint_every) < 1 or not self.lr >= 0:
            raise ValueError(f"steps, batch_size, eval_every and checkpoint_every must be >= 1 and lr >= 0 (got "
                             f"{self.steps}, {self.batch_size}, {self.eval_every}, {self.checkpoint_every}, {self.lr})")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (got {self.threads})")
        check_seeds(self.seed, 1, "seed")


LOOP_ALIASES = {name: f"loop.{name}" for name in ("steps", "batch_size", "lr", "eval_every", "checkpoint_every",
                                                  "seed", "resume", "threads", "progress")}


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
    env: str = ""
    """A registered env (`gymnasium:Pusher-v5`, `metaworld:pick-place-v3`, `robotics:FrankaKitchen-v1`) or an import
    path `package.module:factory`; empty: the tabletop family. Suite envs act with the suite's scripted policy."""
    noise: float = 0.0
    """Expert degradation, 0 (perfect) .. 1 (poor): random motions and suction drop-outs.
    The executed action is recorded as `action`, the expert's unperturbed one as `policy_action`."""
    coach: bool = False
    """Coached demonstrations (pick_place, sort): at the first place-on-a-pad subtask an operator sends the block to a
    pad no goal uses, in a training coaching text ("put it on the blue pad instead"); the expert follows and the plan
    ends there (success False: the env's goal is the original pad; 80 steps). Episode ids `<family>-coached-s<seed>`."""
    seed: int = 0
    """First episode seed."""
    cameras: tuple[str, ...] | None = None
    """Cameras recorded (tabletop: front, top; a suite env: its declared cameras); None: the default camera (the
    tabletop's front); none given: state-only episodes."""
    image_size: int = 64
    """Square image size in pixels."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"--episodes must be >= 1 (got {self.episodes})")
        if not 0.0 <= self.noise <= 2.0:
            raise ValueError(f"--noise must be within 0..2 (got {self.noise})")
        bad = [c for c in self.cameras or () if c not in CAMERAS] if not self.env else []
        if bad:
            raise ValueError(f"--cameras {bad} unknown; choose from {list(CAMERAS)}")
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0 (got {self.seed})")
        check_seeds(self.seed, self.episodes, "--seed", "--episodes")


@dataclass(frozen=True)
class TrainPolicyConfig:
    ALIASES: ClassVar[dict[str, str]] = {"horizon": "chunk_length", "advantage": "advantage_labels",  # old names
                                         "eval_seed": "eval.first", "eval_episodes": "eval.count", **LOOP_ALIASES}

    data: str = "runs/demos/pick_place.zarr"
    """Zarr store of episodes to learn from (e.g. made by collect_demos)."""
    out: str = "runs/policy"
    """Checkpoint directory; training resumes from it when it holds a resumable checkpoint."""
    loop: Loop = Loop(steps=20000, batch_size=64, lr=3e-4, eval_every=2000)
    noise_samples: int = 4
    """Flow-matching (time, noise) draws per example and step."""
    shift: int = 4
    """Random-shift image augmentation, in pixels (0: off)."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras the policy sees (the store must hold their images)."""
    labels: Literal["action", "intended"] = "action"
    """Action labels: the executed `action`, or `policy_action` where recorded (DART: the expert's intent)."""
    chunk_length: int = 16
    """Actions per chunk (T)."""
    denoise_steps: int = 10
    """Euler steps per chunk (K)."""
    hidden: int = 256
    """Width of the flow head."""
    advantage_dropout: float = 0.3
    """Probability of dropping the advantage indicator (only matters with RECAP labels)."""
    advantage_labels: str = ""
    """RECAP labels: an advantage sidecar made by label_advantages for --data; empty: none."""
    init: str = ""
    """Start from this policy checkpoint's weights and normalisation (fine-tuning); empty: from scratch."""
    subgoal_weight: float = 1.0
    """Weight of the auxiliary loss: predict where the end effector is when the subtask ends (0: off)."""
    eval: Seeds = Seeds(count=10)
    """Held-out seeds of the closed-loop evaluation every --loop.eval_every steps (count 0: none)."""
    eval_family: FAMILIES_OR_ALL = "pick_place"
    """Task family of the closed-loop evaluation (all: each family on the --eval seeds, success per family)."""
    n_exec: int = 8
    """Actions of each chunk executed before asking for the next (receding horizon)."""
    paraphrase: float = 0.0
    """Probability that a training example's subtask text is swapped for one of its training phrasings
    (tabletop.phrasing.TRAIN, the recorded text among them); 0: the recorded texts only."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.paraphrase <= 1.0:
            raise ValueError(f"--paraphrase must be within 0..1 (got {self.paraphrase})")
        if self.noise_samples < 1:
            raise ValueError("--noise_samples must be >= 1")
        if not 0.0 <= self.advantage_dropout <= 1.0:
            raise ValueError(f"--advantage_dropout must be within 0..1 (got {self.advantage_dropout})")
        if self.subgoal_weight < 0:
            raise ValueError(f"--subgoal_weight must be >= 0 (got {self.subgoal_weight})")
        if not 1 <= self.n_exec <= self.chunk_length:
            raise ValueError(f"--n_exec must be within 1..--chunk_length ({self.chunk_length}), got {self.n_exec}")
        bad = [c for c in self.cameras if c not in CAMERAS]
        if bad or not self.cameras:
            raise ValueError(f"--cameras must name one or more of {list(CAMERAS)}, got {list(self.cameras)}")


@dataclass(frozen=True)
class TrainCriticConfig:
    ALIASES: ClassVar[dict[str, str]] = LOOP_ALIASES  # old names

    data: str = "runs/demos/pick_place.zarr"
    """Zarr store of episodes (successes and failures both help)."""
    out: str = "runs/critic"
    """Checkpoint directory; training resumes from it when it holds a resumable checkpoint."""
    loop: Loop = Loop(steps=6000, batch_size=128, lr=3e-4, eval_every=1000)
    shift: int = 4
    """Random-shift image augmentation, in pixels."""
    cameras: tuple[str, ...] = ("front",)
    """Cameras the critic sees."""
    max_steps: int = 80
    """Return normalisation: the task family's episode length limit."""
    time_input: bool = True
    """The critic also reads the episode step (step / max_steps): episodes fail at the step limit, so a
    state's value depends on the time left."""
    actor_input: bool = False
    """The critic also reads who acted in each episode (a demonstrator: `collect_demos`; the policy: a
    RolloutHost's rollouts, takeovers included) and values states for the policy at run time, so the
    demonstrator's higher returns do not leak into the policy's values."""
    plan_steps: int = 0
    """The critic also reads the next `plan_steps` actions executed from each state (a Q on the plan;
    at run time, the first actions of the chunk the policy is about to execute); 0: no plan input."""
    plan_dropout: float = 0.3
    """With --plan_steps: share of training examples whose plan is hidden, so the same critic also gives
    the value of the state alone (what advantage labels and the rollout host use)."""
    privileged: bool = False
    """The critic also reads the sim's privileged state the episodes record (the env's `privileged` observation:
    object and gripper poses a robot does not sense; the tabletop records it). The policy never reads it; at run
    time the env must give it (a sim)."""
    privileged_noise: float = 0.0
    """With --privileged: Gaussian noise added to each training example's privileged state, in units of each
    number's spread over the training steps (the exact poses name each training episode, which a critic can
    learn by heart; noise keeps the coarse geometry and blurs the name, as the images' random shift does). 0:
    none."""
    init_policy: str = ""
    """Start the critic's vision and language encoders from this policy checkpoint's (same encoder sizes);
    empty: from scratch."""
    val_fraction: float = 0.1
    """Share of episodes held out for evaluation (held-out loss and value error every --loop.eval_every
    steps); the split follows --loop.seed."""
    branch_values: str = ""
    """A branch sidecar (`<store>.branches.npz`, from `recap --advantage_source branches|distilled`): at the
    states it values, the critic's target is the branches' mean return instead of the episode's own
    (a Monte-Carlo value of several continuations: the critic is distilled from them). Empty: none."""

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("--max_steps must be >= 1")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"--val_fraction must be within (0, 1), got {self.val_fraction}")
        if self.plan_steps < 0 or not 0.0 <= self.plan_dropout < 1.0:
            raise ValueError(f"--plan_steps must be >= 0 and --plan_dropout within [0, 1), got "
                             f"{self.plan_steps} and {self.plan_dropout}")
        if not 0.0 <= self.privileged_noise <= 10.0 or (self.privileged_noise and not self.privileged):
            raise ValueError(f"--privileged_noise must be within [0, 10] and is for a --privileged critic, got "
                             f"{self.privileged_noise}")


@dataclass(frozen=True)
class LabelAdvantagesConfig:
    data: str = "runs/recap/episodes.zarr"
    """Zarr store of episodes to label (never modified)."""
    critic: str = "checkpoints/critic"
    """Critic checkpoint whose values the advantages use."""
    recipe: str = "tabletop"
    """The critic's family, whose recipe values a store's steps (`learning.recap_recipe`: a registered name or an import
    path `package.module:Recipe`; `tabletop`: the example's value critic)."""
    n: int = 10
    """N of the N-step advantage, in control steps."""
    max_steps: int = 80
    """Return normalisation: the task's episode length limit (as the critic was trained)."""
    positive_fraction: float = 0.3
    """Share of each task's autonomous steps labelled positive."""
    out: str = ""
    """Sidecar path; empty: <store>.advantage.npz next to the store."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_steps < 1:
            raise ValueError("--n and --max_steps must be >= 1")
        if not 0.0 < self.positive_fraction < 1.0:
            raise ValueError(f"--positive_fraction must be within (0, 1), got {self.positive_fraction}")


@dataclass(frozen=True)
class RecapConfig:
    ALIASES: ClassVar[dict[str, str]] = {"eval_episodes": "eval.count", "eval_seed": "eval.first",  # old names
                                         "select_episodes": "select.count", "select_seed": "select.first"}

    iterations: int = 2
    """RECAP iterations after the behaviour-cloning baseline (iteration 0)."""
    recipe: str = "tabletop"
    """How the policy and critic are trained and judged (`learning.recap_recipe`): a registered recipe (entry-point
    group `capsule_rollout.recipes`; `tabletop`: the example's flow policy and value critic) or an import path
    `package.module:Recipe`."""
    family: FAMILIES = "pick_place"
    """Task family."""
    out: str = "runs/recap"
    """Output directory: episodes.zarr (demos, then every iteration's rollouts), policy_k/, critic_k/, control_k/."""
    demo_episodes: int = 300
    """Mixed-quality demonstrations for iteration 0 (the noisy expert)."""
    demo_noise: float = 0.5
    """Expert noise of those demonstrations (0.5: about 78% succeed)."""
    bc_steps: int = 6000
    """Optimizer steps of the iteration-0 behaviour cloning."""
    policy_steps: int = 3000
    """Optimizer steps per iteration (fine-tuning the previous policy with advantage labels)."""
    critic_steps: int = 1500
    """Optimizer steps of each critic (trained from scratch on everything collected)."""
    critic_cameras: tuple[str, ...] = ("front",)
    """Cameras the critic sees (the policy sees the front camera); every episode records them all."""
    critic_actor_input: bool = False
    """Critics read who acted (demonstrator or policy; see `train_critic --actor_input`) and value the
    policy's states for the policy."""
    critic_privileged: bool = False
    """Critics also read the sim's privileged state (object and gripper poses, `train_critic --privileged`): for
    the takeovers and the advantage labels; the policy sees what a robot sees."""
    critic_privileged_noise: float = 0.0
    """With --critic_privileged: `train_critic --privileged_noise` (training noise on the privileged state)."""
    critic_plan_steps: int = 0
    """Critics also read the first this many actions of the chunk about to run (see `train_critic
    --plan_steps`); the held-out failure AUC then values each state with the policy's chunk. Takeovers
    and advantage labels use the value of the state alone. 0: no plan input."""
    rollout_episodes: int = 50
    """Rollouts collected per iteration (with simulated takeovers)."""
    seed: int = 0
    """Seed of the run: training seeds, the demonstrations' block of seeds (from `seed * 100000`) and the
    rollouts' (below); the held-out evaluation seeds stay the same. Repeat a run with another seed."""
    rollout_seed: int = 2_000_000
    """First rollout seed of run seed 0 (iteration k of run seed s starts at `rollout_seed + s*1e6 + k*1e5`)."""
    control: bool = True
    """Also train a control arm each iteration: the same steps on the same data, without advantage labels."""
    eval: Seeds = Seeds(first=1_000_000, count=200)
    """Held-out evaluation seeds, one episode each per iteration (the same seeds every iteration, every arm)."""
    n: int = 10
    """N of the N-step advantage, in control steps."""
    positive_fraction: float = 0.3
    """Share of autonomous steps labelled positive."""
    takeover_threshold: float = -0.8
    """The simulated operator takes over when the chunk's value is below this."""
    takeover_steps: int = 10
    """Control steps of each takeover (the scripted expert acts)."""
    beta: float | None = None
    """Classifier-free guidance weight at evaluation (None: the positive-conditioned policy alone)."""
    betas: tuple[float, ...] = ()
    """Guidance weights to choose from each iteration: the positive indicator alone and each of these are
    played on the selection seeds (never the held-out ones), and the best is evaluated on the held-out
    seeds and used for the next rollouts. Empty: `--beta` as given."""
    select: Seeds = Seeds(first=1_500_000, count=200)
    """Seeds that choose among `--betas` (disjoint from the held-out, demonstration and rollout seeds)."""
    advantage_source: Literal["critic", "branches", "distilled", "combined"] = "critic"
    """Where the advantage labels come from: `critic`, the iteration's critic (trained on the episodes'
    returns); `branches`, branch values from capsule forks at sampled chunks of the iteration's rollouts
    (`learning.branch_values`: the chunk's value after minus before; steps of chunks nobody branched carry
    no label); `distilled`, a critic trained with those branch values as its targets where they exist,
    labelling every step; `combined`, the critic's labels with the branched chunks' advantages in their place.
    With all but `critic`, the branch values go to `<store>.branches.npz`."""
    branches: int = 4
    """Continuations per branched boundary (`--advantage_source branches|distilled|combined`)."""
    branch_rate: float = 0.25
    """Share of the rollouts' eligible chunks (every chunk the policy began, after a takeover too) whose value
    before and after is branched."""
    branch_select: Literal["random", "unsure", "open"] = "random"
    """Which eligible chunks are branched: `random`, drawn at `--branch_rate` in each rollout; `unsure`, the
    `--branch_rate` share of all the iteration's eligible chunks whose advantage by the recorded critic values
    is nearest the labelling threshold (where the critic's label is least sure); `open`, a screening pass of
    `--branch_screen` continuations at the chunks drawn at random, then `--branches` more at both boundaries
    of each chunk where a boundary's continuations disagree (only those chunks are valued)."""
    branch_screen: int = 2
    """`--branch_select open`: continuations per boundary of the screening pass (at least 2)."""
    n_exec: int = 8
    """Actions per chunk executed."""
    batch_size: int = 64
    """Training batch size."""
    actors: int = 2
    """Ray actors that play the rollouts, the branches and the evaluations (0: in this process, without Ray); results
    do not depend on it."""
    slots: int = 1
    """Env slots per actor for the rollouts and the branch values: episodes (and each episode's continuations,
    forks of a boundary's capsule) side by side with the policy and critic batched (a batch of N rows rounds
    differently from a batch of 1: the run's episodes depend on it, the evaluations do not use it)."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        if self.actors < 0 or self.slots < 1:
            raise ValueError(f"--actors must be >= 0 and --slots >= 1 (got {self.actors}, {self.slots})")
        if self.iterations < 0 or min(self.demo_episodes, self.rollout_episodes, self.eval.count) < 1:
            raise ValueError("--iterations must be >= 0 and the episode counts >= 1")
        if min(self.bc_steps, self.policy_steps, self.critic_steps, self.n, self.takeover_steps) < 1:
            raise ValueError("step counts must be >= 1")
        if not 0 <= self.critic_plan_steps <= self.n_exec:
            raise ValueError(f"--critic_plan_steps must be within 0..--n_exec ({self.n_exec}): the plan is the "
                             f"start of the chunk about to run; got {self.critic_plan_steps}")
        bad = [c for c in self.critic_cameras if c not in CAMERAS]
        if bad or not self.critic_cameras:
            raise ValueError(f"--critic_cameras must name one or more of {list(CAMERAS)}, "
                             f"got {list(self.critic_cameras)}")
        if self.seed < 0 or self.demo_episodes > 100_000 or self.rollout_episodes > 100_000:
            raise ValueError("--seed must be >= 0, and --demo_episodes / --rollout_episodes at most 100000")
        if self.branch_select == "open" and self.branch_screen < 2:
            raise ValueError(f"--branch_screen must be >= 2 (its continuations must be able to disagree), got "
                             f"{self.branch_screen}")
        if self.branches < 1 or not 0.0 < self.branch_rate <= 1.0:
            raise ValueError(f"--branches must be >= 1 and --branch_rate within (0, 1], got {self.branches} and "
                             f"{self.branch_rate}")
        if self.betas and self.beta is not None:
            raise ValueError("give --beta (a fixed guidance weight) or --betas (chosen each iteration), not both")
        if any(not b > 0 for b in self.betas) or (self.beta is not None and not self.beta > 0):
            raise ValueError(f"guidance weights must be > 0 (1: the positive-conditioned policy), "
                             f"got --beta {self.beta} --betas {list(self.betas)}")
        if not 1 <= self.select.count <= 100_000:
            raise ValueError("--select.count (--select_episodes) must be in 1..100000")
        evaluation = {"held-out evaluation": self.eval.range}
        if self.betas:
            evaluation["guidance selection"] = self.select.range
        used = {"demonstration": range(self.demo_first_seed, self.demo_first_seed + self.demo_episodes),
                "rollout": range(self.rollout_first_seed(0),
                                 self.rollout_first_seed(self.iterations) + self.rollout_episodes),
                **evaluation}
        for name, block in evaluation.items():  # no evaluation block may share a seed with any other block
            for what, seeds in used.items():
                if what != name and seeds.start < block.stop and block.start < seeds.stop:
                    raise ValueError(f"{what} seeds {seeds.start}..{seeds.stop - 1} overlap the {name} "
                                     f"seeds {block.start}..{block.stop - 1}: change --seed, --rollout_seed, "
                                     f"--select.first (--select_seed) or --eval.first (--eval_seed)")

    @property
    def demo_first_seed(self) -> int:
        return self.seed * 100_000

    def rollout_first_seed(self, k: int) -> int:
        """First rollout seed of iteration k (a block per run seed and iteration)."""
        return self.rollout_seed + self.seed * 1_000_000 + k * 100_000
