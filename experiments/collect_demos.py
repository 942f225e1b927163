"""collect_demos: scripted-expert episodes to a zarr store or .npz files."""

from __future__ import annotations

import time

from tqdm import tqdm

from envs.scripted_expert import ScriptedExpert
from envs.tabletop_env import TabletopEnv
from experiments.configs import CollectDemosConfig
from experiments.console import make_console
from experiments.result import ExperimentResult
from rollout.demo_collector import demo_episode_id, record_episode
from rollout.npz_recorder import NpzRecorder
from rollout.zarr_recorder import ZarrRecorder


def run(config: CollectDemosConfig) -> ExperimentResult:
    env = TabletopEnv(config.family, cameras=config.cameras, image_size=config.image_size)
    recorder = ZarrRecorder(config.out) if config.format == "zarr" else NpzRecorder(config.out)
    episodes = successes = steps = skipped = 0
    seeds = range(config.seed, config.seed + config.episodes)
    bar = tqdm(seeds, desc=f"collect {config.family}", unit="ep", disable=not config.progress)
    start = time.perf_counter()
    try:
        for seed in bar:
            episode_id = demo_episode_id(config.family, seed)
            if _recorded(recorder, episode_id):
                skipped += 1
                continue
            expert = ScriptedExpert(env, noise=config.noise, seed=seed)
            episode = record_episode(env, expert.act, seed=seed, episode_id=episode_id,
                                     proposed=lambda expert=expert: expert.intended)
            recorder.write(episode)
            episodes += 1
            successes += episode.meta.success
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
        "noise": config.noise,
        "store": str(config.out),
        "format": config.format,
    }
    if episodes:
        make_console().print(
            f"{episodes} episodes ({skipped} already recorded), success {summary['success_rate']:.1%}, "
            f"{summary['steps_per_s'] or 0:.0f} steps/s -> {config.out}")
    else:  # a resumed run: no rate to report over zero new episodes
        make_console().print(f"all {skipped} episodes already recorded in {config.out}")
    return ExperimentResult(summary)


def _recorded(recorder, episode_id: str) -> bool:
    if isinstance(recorder, ZarrRecorder):
        return episode_id in recorder
    return recorder.path_for(episode_id).exists()
