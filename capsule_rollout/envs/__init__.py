"""MuJoCo tabletop tasks (gymnasium API), the capsule adapter for third-party MuJoCo envs, the robot bridge;
imports only `capsules`.

Importing this package defines things only: no environment variable is written (the GL backend is chosen
when a renderer is made: `envs.gl_backend`) and no gymnasium id is registered until `register_envs()` is
called: `TabletopPickPlace-v0`, `TabletopStack-v0`, `TabletopArrange-v0`, `TabletopSort-v0`.
"""

ENV_IDS = {
    "TabletopPickPlace-v0": "pick_place",
    "TabletopStack-v0": "stack",
    "TabletopArrange-v0": "arrange",
    "TabletopSort-v0": "sort",
}


def register_envs() -> list[str]:
    """Register the tabletop gymnasium ids (idempotent); returns them. mujoco loads at `gymnasium.make`."""
    import gymnasium

    for env_id, family in ENV_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point="capsule_rollout.envs.tabletop_env:TabletopEnv",
                               kwargs={"family": family})
    return list(ENV_IDS)
