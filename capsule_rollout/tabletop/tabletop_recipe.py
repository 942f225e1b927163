"""The example's RECAP recipe (`learning.recap_recipe.RecapRecipe`, registered as `tabletop`): demonstrations of the
noisy scripted expert, the flow policy (`tabletop.fit_policy`) and the value critic (`tabletop.fit_critic`)
trained on the run's store, evaluated with the tabletop's failure kinds and task phases."""

from __future__ import annotations

from pathlib import Path

from capsule_rollout.learning.demo_sources import collect_demos
from capsule_rollout.learning.options import (
    CollectDemosConfig,
    LabelAdvantagesConfig,
    Loop,
    RecapConfig,
    Seeds,
    TrainCriticConfig,
    TrainPolicyConfig,
)
from capsule_rollout.learning.training import Log
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.tabletop.critic_labels import StoreValues
from capsule_rollout.tabletop.expert_demos import demo_source
from capsule_rollout.tabletop.fit_critic import fit_critic
from capsule_rollout.tabletop.fit_policy import fit_policy
from capsule_rollout.tabletop.tabletop_eval import evaluate_policy
from capsule_rollout.tabletop.tasks import FAMILIES, family_index


class TabletopRecipe:
    """The flow policy and value critic on a tabletop family (`RecapConfig.family`)."""

    def cameras(self, config: RecapConfig) -> tuple[str, ...]:
        # every camera either model sees, in first-seen order (what the episodes record)
        return tuple(dict.fromkeys((*TrainPolicyConfig.cameras, *config.critic_cameras)))

    def episode_limit(self, config: RecapConfig) -> int:
        return FAMILIES[family_index(config.family)].max_steps

    def rollout_spec(self, config: RecapConfig) -> RunSpec:
        return RunSpec(env=f"tabletop:{config.family}")

    def collect_demos(self, config: RecapConfig, store: Path, cameras: tuple[str, ...]) -> dict:
        demos = CollectDemosConfig(episodes=config.demo_episodes, out=str(store), family=config.family,
                                   noise=config.demo_noise, seed=config.demo_first_seed, cameras=cameras,
                                   progress=config.progress)
        return collect_demos(demos, demo_source(demos))

    def fit_policy(self, config: RecapConfig, store: Path, out: Path, *, steps: int, init: Path | None = None,
                   advantage_labels: Path | None = None, log: Log = print) -> None:
        loop = Loop(steps=steps, batch_size=config.batch_size, seed=config.seed, progress=config.progress)
        fit_policy(TrainPolicyConfig(loop=loop, data=str(store), out=str(out), init=str(init or ""),
                                     advantage_labels=str(advantage_labels or ""), n_exec=config.n_exec,
                                     eval=Seeds(count=0), eval_family=config.family, shift=0), log=log)

    def fit_critic(self, config: RecapConfig, store: Path, out: Path, *, branch_values: str = "",
                   log: Log = print) -> None:
        loop = Loop(steps=config.critic_steps, batch_size=TrainCriticConfig.loop.batch_size,
                    eval_every=config.critic_steps, seed=config.seed, progress=config.progress)
        fit_critic(TrainCriticConfig(data=str(store), out=str(out), loop=loop, cameras=config.critic_cameras,
                                     actor_input=config.critic_actor_input, plan_steps=config.critic_plan_steps,
                                     privileged=config.critic_privileged,
                                     privileged_noise=config.critic_privileged_noise,
                                     max_steps=LabelAdvantagesConfig.max_steps, branch_values=branch_values),
                   log=log)

    def store_critic(self, critic: Path) -> StoreValues:
        return StoreValues(str(critic))

    def evaluate(self, config: RecapConfig, policy: Path, seeds: list[int], *, conditioned: bool,
                 beta: float | None = None, critic: Path | None = None) -> dict:
        return evaluate_policy(str(policy), family=config.family, seeds=seeds, n_exec=config.n_exec,
                               advantage="positive" if conditioned else "none", beta=beta,
                               critics=[str(critic)] if critic else (), actors=config.actors)
