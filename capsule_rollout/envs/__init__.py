"""Envs for the rollout host: the env side of the rollout protocol (`rollout_env`), the capsule adapter for any
MuJoCo env (`mujoco_capsule`, the `suites` registry), offscreen rendering, the robot bridge and operator input;
imports only `capsules`. Importing it defines things only: no environment variable is written (the GL backend
is chosen when a renderer is made: `envs.gl_backend`) and nothing is registered.

What a user needs: `make_env` (an env id `suite:task`, `gymnasium:<registered id>` or a factory
`package.module:make_env`, as a rollout env), the env protocol (`RolloutEnv`, `ObservationSpec`), the adapter of
any gymnasium MuJoCo env (`MujocoCapsuleEnv` with a `CaptureSpec`, `Camera`, `Attr` for what a suite declares),
`describe_env` (its control rate, dimension names and cameras).
Names load on first use (`__getattr__`, PEP 562): importing the package imports nothing more.
"""

from __future__ import annotations

from capsule_rollout.lazy_exports import lazy_exports

_EXPORTS = {
    "make_env": "capsule_rollout.envs.suites",
    "parse_env_id": "capsule_rollout.envs.suites",
    "expert_for": "capsule_rollout.envs.suites",
    "RolloutEnv": "capsule_rollout.envs.rollout_env",
    "ObservationSpec": "capsule_rollout.envs.rollout_env",
    "ArraySpec": "capsule_rollout.envs.rollout_env",
    "action_bounds": "capsule_rollout.envs.rollout_env",
    "MujocoCapsuleEnv": "capsule_rollout.envs.mujoco_capsule",
    "CaptureSpec": "capsule_rollout.envs.mujoco_capsule",
    "Camera": "capsule_rollout.envs.mujoco_capsule",
    "Attr": "capsule_rollout.envs.mujoco_capsule",
    "describe_env": "capsule_rollout.envs.describe",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
