"""real_recap: RECAP rollouts on a robot through the robot bridge, with an operator.

The RolloutHost runs the policy and critic over a `RobotClient` (the robot is
homed before every episode); the operator ends episodes (success / failure
labels), takes over (those steps come from the robot side's teleoperation device
and are flagged as interventions), coaches new subtasks or e-stops, at this terminal or, when the robot side
reads operator input of its own (a LeRobot teleoperator's buttons), there too. Episodes go to
`<out>/npz/<episode_id>.npz` and `<out>/episodes.zarr`. Against a sim robot:
start `SimRobotServer` (see docs/how-to/robot.md) and point --robot.port at it.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from capsule_rollout.cli.console import make_console
from capsule_rollout.cli.paths import resolve_input
from capsule_rollout.commands.configs import RealRecapConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.envs.robot_env import RobotEnv
from capsule_rollout.robot_side.operator import OperatorMix, RobotOperator
from capsule_rollout.robot_side.operator_input import KeyboardOperator, ScriptedOperator, parse_script
from capsule_rollout.rollout.host_factory import RunSpec, build_host, resolve_acting, resolve_spec
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.stores.npz_recorder import NpzRecorder
from capsule_rollout.stores.zarr_recorder import ZarrRecorder


def run(config: RealRecapConfig) -> ExperimentResult:
    console = make_console()
    out = Path(config.out)
    policy = resolve_input(config.model.policy)
    with checking_inputs():  # before connecting: a bad checkpoint, --beta or --script never moves the robot
        if config.robot.port <= 0:
            raise ValueError("--robot.port is required: the port the robot server listens on")
        if config.operator == "script":
            parse_script(config.script)  # a malformed item is named here, not after connecting
        n_exec, noise_scale = resolve_acting(policy, config.act.n_exec, config.act.noise_scale)
        spec = RunSpec(policy=policy,
                        critic=resolve_input(config.model.critic) if config.model.critic else "",
                        advantage=config.act.advantage, beta=config.act.beta, noise_scale=noise_scale, threads=0,
                        host=HostConfig(n_exec=n_exec, value_threshold=config.value_threshold,
                                        value_patience=config.value_patience, max_steps=config.max_steps))
        spec = resolve_spec(spec)  # once: the host below takes it as it is
        conditioning = spec.resolved.conditioning
    client = RobotClient(config.robot.host, config.robot.port, token=config.robot.token)
    operator = _operator(config, client)
    try:
        env = RobotEnv(client, max_steps=config.max_steps)
        host = build_host(spec, env=env, observers=[], operator=operator,
                          teleop=client.teleop_action if config.teleop and client.has_teleop else None)
    except Exception:
        client.close()
        raise
    npz, zarr = NpzRecorder(out / "npz"), ZarrRecorder(out / "episodes.zarr")
    console.print(f"robot {client.robot} at {config.robot.host}:{config.robot.port}; cameras {list(client.cameras)}; "
                  f"policy acting with advantage {conditioning.advantage}"
                  + (f", guidance beta {conditioning.beta:g}" if conditioning.beta else ""))
    try:
        results = _play(host, config, operator, (npz, zarr), console)
    finally:
        zarr.close()
        if host.lanes is not None:
            host.lanes.close()
        client.close()
        if operator is not None:
            operator.close()
    episodes = [r.episode for r in results]
    interventions = [e.steps["intervention"].sum() for e in episodes]
    return ExperimentResult({
        "episodes": len(episodes),
        "successes": sum(e.meta.success for e in episodes),
        "stop_reasons": dict(Counter(e.meta.stop_reason for e in episodes)),
        "interventions_per_episode": float(np.mean(interventions)) if episodes else 0.0,
        "store": str(out / "episodes.zarr"),
        "npz": str(out / "npz"),
        "advantage": conditioning.advantage,
        "beta": conditioning.beta,
    })


def _play(host, config: RealRecapConfig, operator, recorders, console) -> list:
    """`config.episodes` episodes on the robot, each written to every recorder; the results of those that ran."""
    results = []
    for i in range(config.episodes):
        seed = None if config.seed is None else config.seed + i
        _new_episode(operator)
        result = host.run_episode(seed if seed is not None else i,
                                  episode_id=f"{time.strftime('%Y%m%d-%H%M%S')}-{i:04d}")
        if result.episode is None:
            console.print(f"episode {i}: failed before its first step ({result.error})")
            continue
        for recorder in recorders:
            recorder.write(result.episode)
        meta = result.episode.meta
        n_int = int(result.episode.steps["intervention"].sum())
        console.print(f"episode {meta.episode_id}: {meta.stop_reason}, success {meta.success}, "
                      f"{meta.length} steps, {n_int} intervention steps"
                      + (f" ({result.error})" if result.error else ""))
        results.append(result)
    return results


def _new_episode(operator) -> None:
    """The script from its start; what the robot side's operator did after the last episode ended, dropped."""
    for source in operator.sources if isinstance(operator, OperatorMix) else (operator,):
        if isinstance(source, ScriptedOperator):
            source.reset()
        elif isinstance(source, RobotOperator):
            source.drop_pending()


def _operator(config: RealRecapConfig, client: RobotClient):
    """The operator input `--operator` names (the keyboard, a script of events, or none), with the robot side's
    own (a teleoperator's buttons) when it has one."""
    sources = []
    if config.operator == "keyboard":
        sources.append(KeyboardOperator(sys.stdin, echo=sys.stderr))
    elif config.operator == "script":
        sources.append(ScriptedOperator(parse_script(config.script)))
    if client.has_operator:
        sources.append(RobotOperator(client))
    if len(sources) > 1:
        return OperatorMix(sources)
    return sources[0] if sources else None
