"""Demonstrations: a scripted policy's episodes (a suite's own, or the example's `tabletop.expert_demos`) to a store."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

from capsule_rollout.learning.options import CollectDemosConfig
from capsule_rollout.rollout.demo_collector import demo_episode_id, record_episode
from capsule_rollout.rollout.record import keep_env_description
from capsule_rollout.stores.npz_recorder import NpzRecorder
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


@dataclass
class DemoSource:
    """What `collect_demos` records: an env, the task name its episode ids carry, and a factory of the scripted
    policy for a seed (`seed -> (act, proposed)`: `act()` the next action, `proposed()` the action it meant
    before any noise, or None); `plan_done()`, when given, says after an episode whether the plan the
    demonstrator followed was completed (a coached plan, which the env's own success does not measure)."""

    env: object
    task: str
    make_expert: Callable[[int], tuple[Callable, Callable | None]]
    plan_done: Callable[[], bool] | None = None


def suite_demo_source(config: CollectDemosConfig) -> DemoSource:
    """The env of `config.env` (a registered id or `package.module:factory`) and the suite's own scripted
    policy; ValueError when it ships none (the command line reports it as a usage error)."""
    from capsule_rollout.envs.suites import expert_for, make_env

    if config.coach:
        raise ValueError("--coach applies to the tabletop's expert only")
    env = make_env(config.env, cameras=config.cameras, image_size=config.image_size)
    act = expert_for(env)
    if act is None:
        env.close()
        raise ValueError(f"{config.env}: the suite ships no scripted policy to collect demonstrations with")
    if config.noise:
        env.close()
        raise ValueError("--noise applies to the tabletop's expert only")
    return DemoSource(env, env.task, lambda seed: (act, None))


def collect_demos(config: CollectDemosConfig, source: DemoSource) -> dict:
    """Record `source`'s scripted episodes for `config`'s seeds (those the store holds are skipped).

    `source`: made by the caller (so that bad input is reported before anything runs): `suite_demo_source`,
    or an example's own (`tabletop.expert_demos.demo_source`).
    """
    env, task, make_expert = source.env, source.task, source.make_expert
    recorder = ZarrRecorder(config.out) if config.format == "zarr" else NpzRecorder(config.out)
    if isinstance(recorder, ZarrRecorder):  # what the env says of itself (fps, names, cameras), kept with the store
        keep_env_description(config.out, env, config.env or f"tabletop:{config.family}")
    episodes = successes = steps = skipped = plans_done = 0
    seeds = range(config.seed, config.seed + config.episodes)
    bar = tqdm(seeds, desc=f"collect {task}", unit="ep", disable=not config.progress)
    start = time.perf_counter()
    try:
        for seed in bar:
            episode_id = demo_episode_id(task, seed)
            if _recorded(recorder, episode_id) or _recorded(recorder, demo_episode_id(task, seed, legacy=True)):
                skipped += 1
                continue
            act, proposed = make_expert(seed)
            episode = record_episode(env, act, seed=seed, episode_id=episode_id, proposed=proposed)
            recorder.write(episode)
            episodes += 1
            successes += episode.meta.success
            if source.plan_done is not None:  # e.g. a coached plan (the env's own goal is not its success)
                plans_done += source.plan_done()
            steps += episode.length
            elapsed = time.perf_counter() - start
            bar.set_postfix(success=f"{successes / episodes:.0%}", steps_per_s=f"{steps / elapsed:.0f}")
        if isinstance(recorder, ZarrRecorder):
            recorder.flush()
    finally:
        bar.close()
        if isinstance(recorder, ZarrRecorder):
            recorder.close()
        env.close()
    elapsed = time.perf_counter() - start
    summary = {
        "episodes": episodes,
        "successes": successes,
        "success_rate": successes / episodes if episodes else None,
        "steps": steps,
        "steps_per_s": steps / elapsed if elapsed > 0 else None,
        "skipped_already_recorded": skipped,
        "family": config.family,
        "env": config.env,
        "noise": config.noise,
        "coached": config.coach,
        "plan_completed": plans_done if source.plan_done is not None else None,  # e.g. followed the coaching
        "store": str(config.out),
        "format": config.format,
    }
    return summary


def _recorded(recorder, episode_id: str) -> bool:
    if isinstance(recorder, ZarrRecorder):
        return episode_id in recorder
    return recorder.path_for(episode_id).exists()
