"""Demonstrations: the scripted policy's episodes (the tabletop's expert, or a suite's own) to a store."""

from __future__ import annotations

import time

from tqdm import tqdm

from capsule_rollout.learning.coaching import COACHABLE, COACHED_MAX_STEPS, PadCoach, coached_expert
from capsule_rollout.learning.options import CollectDemosConfig
from capsule_rollout.rollout.demo_collector import demo_episode_id, record_episode
from capsule_rollout.stores.npz_recorder import NpzRecorder
from capsule_rollout.stores.zarr_recorder import ZarrRecorder
from capsule_rollout.tabletop.scripted_expert import ScriptedExpert
from capsule_rollout.tabletop.tabletop_env import TabletopEnv


def demo_source(config: CollectDemosConfig):
    """The env and a factory of its scripted policy for a seed: the tabletop's expert, or the suite's own."""
    if not config.env:
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

        # coached episodes are other episodes than the plain ones of the same seeds: ids of their own
        return env, f"{config.family}-coached" if config.coach else config.family, tabletop_expert
    if config.coach:
        raise ValueError("--coach applies to the tabletop's expert only")
    from capsule_rollout.envs.suites import expert_for, make_env

    # bad input raises ValueError (the command line reports it as a usage error)
    env = make_env(config.env, cameras=config.cameras, image_size=config.image_size)
    act = expert_for(env)
    if act is None:
        env.close()
        raise ValueError(f"{config.env}: the suite ships no scripted policy to collect demonstrations with")
    if config.noise:
        env.close()
        raise ValueError("--noise applies to the tabletop's expert only")
    return env, env.task, lambda seed: (act, None)


def collect_demos(config: CollectDemosConfig, source=None) -> dict:
    """Record the scripted policy's episodes for `config`'s seeds (those the store holds are skipped).

    `source`: `demo_source(config)`, made by the caller (so that bad input is reported before anything runs).
    """
    env, task, make_expert = demo_source(config) if source is None else source
    recorder = ZarrRecorder(config.out) if config.format == "zarr" else NpzRecorder(config.out)
    episodes = successes = steps = skipped = plans_done = 0
    seeds = range(config.seed, config.seed + config.episodes)
    bar = tqdm(seeds, desc=f"collect {task}", unit="ep", disable=not config.progress)
    start = time.perf_counter()
    try:
        for seed in bar:
            episode_id = demo_episode_id(task, seed)
            if _recorded(recorder, episode_id):
                skipped += 1
                continue
            act, proposed = make_expert(seed)
            episode = record_episode(env, act, seed=seed, episode_id=episode_id, proposed=proposed)
            recorder.write(episode)
            episodes += 1
            successes += episode.meta.success
            if config.coach:  # the coached plan done (the env's own goal is the original pad: never its success)
                plans_done += env.subtask_index >= len(env.subtasks)
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
        "plan_completed": plans_done if config.coach else None,  # --coach: episodes that followed the coaching
        "store": str(config.out),
        "format": config.format,
    }
    return summary


def _recorded(recorder, episode_id: str) -> bool:
    if isinstance(recorder, ZarrRecorder):
        return episode_id in recorder
    return recorder.path_for(episode_id).exists()
