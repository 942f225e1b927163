"""The project's own example: MuJoCo tabletop tasks (four language-conditioned families with subtasks), their
scripted expert and planner phrasings, the VLA flow policy and the distributional value critic, with the shipped
checkpoints. It plugs into the core (capsules, protocols, host, Ray layer, stores) as a user's code does; the
core's layers never import it (tests/test_layers.py)."""

ENV_IDS = {
    "TabletopPickPlace-v0": "pick_place",
    "TabletopStack-v0": "stack",
    "TabletopArrange-v0": "arrange",
    "TabletopSort-v0": "sort",
}


def register_envs() -> list[str]:
    """Register the tabletop gymnasium ids (idempotent); returns them. Importing this package registers nothing;
    mujoco loads at `gymnasium.make`."""
    import gymnasium

    for env_id, family in ENV_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point="capsule_rollout.tabletop.tabletop_env:TabletopEnv",
                               kwargs={"family": family})
    return list(ENV_IDS)
