"""`describe_env`: what a rollout env says of itself, as plain data (kept with a store as
`stores.env_description.EnvDescription`): its control rate, the names of its state and action dimensions and
its cameras.

Each is the env's own word where it gives one (`control_hz`, `dimension_names` on the rollout env, as the
tabletop example's env has them), else read from the gymnasium MuJoCo env inside a `MujocoCapsuleEnv`: the
control rate from its `dt` (gymnasium's MuJoCo envs: timestep x frame skip), its `control_freq` (robosuite) or
its `metadata["render_fps"]`; the action's names from the model's actuators when the action drives them one
for one (each actuator's name, else its joint's); a `state_names` / `action_names` attribute of the user's env
wins over both. Unknown is None (or no names), never a guess from another env.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import mujoco

from capsule_rollout.envs.rollout_env import STATE_KEY, RolloutEnv, image_key

ACTION_KEY = "action"


def describe_env(env: RolloutEnv) -> dict[str, Any]:
    """`{"control_hz", "names", "cameras", "image_size"}` of `env` (see the module docstring)."""
    cameras = tuple(env.observation_spec.cameras)
    sizes = {tuple(env.observation_spec.arrays[image_key(c)].shape[:2]) for c in cameras}
    return {"control_hz": control_hz(env), "names": dimension_names(env), "cameras": cameras,
            "image_size": sizes.pop() if len(sizes) == 1 else None}


def _inner(env: RolloutEnv):
    """The gymnasium env inside an adapter (its unwrapped env), or None."""
    inner = getattr(env, "unwrapped", None)
    return inner if inner is not None and inner is not env else None


def control_hz(env: RolloutEnv) -> float | None:
    """Control steps per second: the env's own `control_hz`, else its gymnasium env's `dt`, `control_freq` or
    `metadata["render_fps"]`; None when none is told."""
    for owner in (env, _inner(env)):
        if owner is None:
            continue
        for value in (getattr(owner, "control_hz", None), _rate_of_dt(owner), getattr(owner, "control_freq", None),
                      (getattr(owner, "metadata", None) or {}).get("render_fps")):
            rate = _positive(value)
            if rate is not None:
                return rate
    return None


def _rate_of_dt(owner) -> float | None:
    try:
        dt = owner.dt
    except Exception:  # noqa: BLE001 - a property that needs a model the env does not have
        return None
    dt = _positive(dt)
    return None if dt is None else 1.0 / dt


def _positive(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def dimension_names(env: RolloutEnv) -> dict[str, list[str]]:
    """Names of the `state` and `action` dimensions the env tells (none it does not)."""
    own = getattr(env, "dimension_names", None)
    names: dict[str, list[str]] = {k: list(v) for k, v in own.items()} if isinstance(own, Mapping) else {}
    inner = _inner(env)
    action_dim = int(env.action_space.shape[0]) if getattr(env.action_space, "shape", None) else 0
    state_dim = env.observation_spec.state_dim
    for key, attr, dim in ((STATE_KEY, "state_names", state_dim), (ACTION_KEY, "action_names", action_dim)):
        told = getattr(inner, attr, None) if inner is not None else None
        if key not in names and _fits(told, dim):
            names[key] = [str(n) for n in told]
    model = getattr(env, "model", None)
    if ACTION_KEY not in names and isinstance(model, mujoco.MjModel) and model.nu == action_dim:
        actuators = actuator_names(model)
        if actuators is not None:
            names[ACTION_KEY] = actuators
    return {k: v for k, v in names.items() if _fits(v, {STATE_KEY: state_dim, ACTION_KEY: action_dim}.get(k, len(v)))}


def _fits(names: Sequence[str] | None, dim: int) -> bool:
    return isinstance(names, Sequence) and not isinstance(names, str) and len(names) == dim and dim > 0


def actuator_names(model: mujoco.MjModel) -> list[str] | None:
    """Each actuator's name, else the name of the joint it drives; None when one has neither (or two share a
    name)."""
    names = []
    for i in range(model.nu):
        name = model.actuator(i).name
        if not name and model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT:
            name = model.joint(int(model.actuator_trnid[i, 0])).name
        if not name:
            return None
        names.append(name)
    return names if len(set(names)) == len(names) else None
