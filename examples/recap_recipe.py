"""A RECAP recipe skeleton: what your policy family brings to the RECAP loop (`recap --recipe
examples.recap_recipe:MyRecipe`), each method to fill in. The loop (demonstrations, rollouts with takeovers on
Ray actors, critic, advantage labels, conditioned fine-tuning, held-out evaluation) is the project's; the example
family's full recipe is `capsule_rollout/tabletop/tabletop_recipe.py`. Every checkpoint your trainers write must load
through a checkpoint loader (entry-point group `capsule_rollout.checkpoints`) so the actors can play it."""
from pathlib import Path

from capsule_rollout.rollout import RunSpec

TODO = "fill in for your policy family (see capsule_rollout/tabletop/tabletop_recipe.py)"


class MyRecipe:
    def cameras(self, config) -> tuple[str, ...]:  # what the run's episodes record
        return ()

    def episode_limit(self, config) -> int:  # control steps an episode lasts at most
        return 150

    def rollout_spec(self, config) -> RunSpec:  # the env part; the loop fills in policy, critic, takeovers
        return RunSpec(env="examples.own_env_and_policy:make_env")

    def collect_demos(self, config, store: Path, cameras: tuple[str, ...]) -> dict:
        raise NotImplementedError(TODO)  # record config.demo_episodes demonstrations into `store`

    def fit_policy(self, config, store: Path, out: Path, *, steps: int, init=None, advantage_labels=None,
                   log=print) -> None:
        raise NotImplementedError(TODO)  # train checkpoint `out` (conditioned on the labels when given)

    def fit_critic(self, config, store: Path, out: Path, *, branch_values: str = "", log=print) -> None:
        raise NotImplementedError(TODO)  # train the critic checkpoint `out` on `store`

    def store_critic(self, critic: Path):
        raise NotImplementedError(TODO)  # a `learning.advantage_labels.StoreCritic` valuing a store's steps

    def evaluate(self, config, policy: Path, seeds: list[int], *, conditioned: bool, beta=None, critic=None) -> dict:
        raise NotImplementedError(TODO)  # `learning.closed_loop_eval.summarize`'s summary of the policy on `seeds`
