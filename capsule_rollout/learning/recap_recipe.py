"""What the RECAP loop (`learning.recap_loop`) needs of a policy and critic family: a recipe.

The loop itself is the same for any family: collect demonstrations, fit a policy and a critic, roll the policy
out on Ray actors with simulated takeovers, branch, label advantages, fit the conditioned policy, evaluate on
held-out seeds. A recipe says how the family's models are trained and what env they play; the example's is
`tabletop.tabletop_recipe.TabletopRecipe`, registered as `tabletop`. A user's family registers its own under the
entry-point group `capsule_rollout.recipes` or is named by import path (`recap --recipe pkg.mod:MyRecipe`).
Every checkpoint a recipe writes must load through a checkpoint loader (`capsule_rollout.checkpoints`), so
the actors can play it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

from capsule_rollout.import_path import resolve
from capsule_rollout.learning.advantage_labels import StoreCritic
from capsule_rollout.learning.options import RecapConfig
from capsule_rollout.learning.training import Log
from capsule_rollout.rollout.host_factory import RunSpec

RECIPES_GROUP = "capsule_rollout.recipes"


class RecapRecipe(Protocol):
    def cameras(self, config: RecapConfig) -> tuple[str, ...]:
        """Every camera the family's policy and critic see: what the run's episodes record."""

    def episode_limit(self, config: RecapConfig) -> int:
        """Control steps an episode of `config`'s task lasts at most (the mid-episode step is half of it)."""

    def rollout_spec(self, config: RecapConfig) -> RunSpec:
        """The env part of the hosts the rollouts, branches and evaluations play (`RunSpec.env`); the loop
        fills in the policy, critic, conditioning and takeovers."""

    def collect_demos(self, config: RecapConfig, store: Path, cameras: tuple[str, ...]) -> dict:
        """Record `config.demo_episodes` demonstrations into `store` (skipping those it holds); the summary has
        `skipped_already_recorded`."""

    def fit_policy(self, config: RecapConfig, store: Path, out: Path, *, steps: int, init: Path | None = None,
                   advantage_labels: Path | None = None, log: Log = print) -> None:
        """Train the policy checkpoint `out` on `store` (from `init`, conditioned on the labels' sidecar when
        given; resuming `out` if it was left unfinished)."""

    def fit_critic(self, config: RecapConfig, store: Path, out: Path, *, branch_values: str = "",
                   log: Log = print) -> None:
        """Train the critic checkpoint `out` on `store` (its targets the branch values where `branch_values`
        names a table)."""

    def store_critic(self, critic: Path) -> StoreCritic:
        """The critic checkpoint `critic` valuing a store's steps (for the advantage labels)."""

    def evaluate(self, config: RecapConfig, policy: Path, seeds: list[int], *, conditioned: bool,
                 beta: float | None = None, critic: Path | None = None) -> dict:
        """The policy on `seeds` (acting with the positive indicator and guidance `beta` when `conditioned`;
        `critic` judged by its mid-episode values): `learning.closed_loop_eval.summarize`'s summary."""


def load_recipe(name: str) -> RecapRecipe:
    """The recipe `name` names: a registered one (entry-point group `RECIPES_GROUP`) or an import path
    `package.module:Recipe` (a class or factory, called with no arguments)."""
    if ":" in name:
        return resolve(name, "recipe")()
    found = {e.name: e for e in entry_points(group=RECIPES_GROUP)}
    if name not in found:
        raise ValueError(f"no RECAP recipe {name!r} (registered: {', '.join(sorted(found)) or 'none'}): give a "
                         "registered name or an import path `package.module:Recipe`")
    return found[name].load()()
