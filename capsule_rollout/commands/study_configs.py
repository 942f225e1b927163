"""Config of `recap_study`, RECAP's yardstick over run seeds and arms (standard library only: the CLI stays
fast)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from capsule_rollout.commands.registry import command
from capsule_rollout.learning.options import RecapConfig

# `cli.recap_study.ARMS`: what each changes in `recap`
STUDY_ARMS = ("critic", "privileged", "rollouts_x4", "finetune_x3", "finetune_third")


@command(
    'recap_study',
    "RECAP's yardstick: run seeds x arms of `recap`, each seed's BC shared by its arms, resumable, outside the tree.",
)
@dataclass(frozen=True)
class RecapStudyConfig:
    root: str = "~/recap_study"
    """Where the runs live (outside the work tree: a checkout does not keep them): <root>/s<seed>/base (the
    seed's demonstrations, behaviour cloning and critic 0), <root>/s<seed>/<arm> (a copy of base, resumed)."""
    history: str = "docs/history/recap_study"
    """Where each finished stage's summary goes as JSON (per seed and arm, per-seed outcomes included): commit
    it, so the yardstick accumulates across runs."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Run seeds (`recap --seed`): each its own demonstrations, behaviour cloning and rollouts."""
    arms: tuple[Literal["critic", "privileged", "rollouts_x4", "finetune_x3", "finetune_third"], ...] = STUDY_ARMS
    """Arms (`cli.recap_study.ARMS`): `critic`, labels from the learned critic; `privileged`, from a
    critic that also reads the sim's privileged state (`recap --critic_privileged`), each with its control arm;
    `rollouts_x4`, critic labels on 4x `--recap.rollout_episodes` per iteration; `finetune_x3` / `finetune_third`,
    critic labels with 3x / a third of `--recap.policy_steps` of fine-tuning per iteration (these three have no
    control: compared with the critic arm)."""
    recap: RecapConfig = RecapConfig(iterations=3, bc_steps=20000, rollout_episodes=200, beta=2.0, slots=4)
    """The `recap` run every arm makes (`--recap.<option>`); `out` and `seed` are the study's."""
    ceiling_branches: int = 8
    """Continuations per state of the branch ceiling the last iteration's critic is measured against
    (`value_ceiling` on the held-out seeds); 0: no ceiling stage."""
    run: bool = True
    """Run (or resume) the stages; False: only write the yardstick's table from what `--history` holds."""

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"--seeds must be distinct run seeds >= 0, got {list(self.seeds)}")
        if not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"--arms must be distinct arms of {list(STUDY_ARMS)}, got {list(self.arms)}")
        if self.ceiling_branches < 0:
            raise ValueError(f"--ceiling_branches must be >= 0, got {self.ceiling_branches}")
