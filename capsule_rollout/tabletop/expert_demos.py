"""The example's demonstrations: the tabletop's scripted expert (noisy with `--noise`, coached with `--coach`),
or a suite's own scripted policy for `--env`, as a `learning.demo_sources.DemoSource`."""

from __future__ import annotations

from capsule_rollout.learning.demo_sources import DemoSource, suite_demo_source
from capsule_rollout.learning.options import CollectDemosConfig
from capsule_rollout.tabletop.coaching import COACHABLE, COACHED_MAX_STEPS, PadCoach, coached_expert
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import TabletopEnv


def demo_source(config: CollectDemosConfig) -> DemoSource:
    """The env and a factory of its scripted policy for a seed: the tabletop's expert, or the suite's own."""
    if config.env:
        return suite_demo_source(config)
    if config.coach and config.family not in COACHABLE:
        raise ValueError(f"--coach sends the held block to another pad: family {config.family!r} has no "
                         f"place-on-a-pad subtask (coachable: {', '.join(COACHABLE)})")
    env = TabletopEnv(
        config.family, cameras=("front",) if config.cameras is None else config.cameras, image_size=config.image_size,
        max_steps=COACHED_MAX_STEPS if config.coach else None,
    )

    def tabletop_expert(seed: int):
        expert = ScriptedExpert(env, noise=config.noise, seed=seed)
        if not config.coach:
            return expert.act, (lambda: expert.intended)
        coach = PadCoach(split="train")
        coach.bind(env, seed)
        return coached_expert(env, expert, coach), (lambda: expert.intended)

    if not config.coach:
        return DemoSource(env, config.family, tabletop_expert)
    # coached episodes are other episodes than the plain ones of the same seeds: ids of their own; the coached
    # plan is done when every subtask (the coached one last) is (the env's own goal is the original pad)
    return DemoSource(env, f"{config.family}-coached", tabletop_expert,
                      plan_done=lambda: env.subtask_index >= len(env.subtasks))
