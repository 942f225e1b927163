"""Third-party envs as their users make them (`gymnasium.make` with its default wrappers, nothing declared),
given to the framework as `tests.envs.user_factories:<name>` (the suites' venv: `make suites-venv`)."""

from __future__ import annotations

import os

import gymnasium


def so101():
    import lerobot_env_so101  # noqa: F401 - registers its ids (its README)

    return gymnasium.make("lerobot_env_so101/SO101PickCube-v0")


def so101_random_block():
    import lerobot_env_so101  # noqa: F401

    return gymnasium.make("lerobot_env_so101/SO101PickCube-v0", random_block_position=True)


def _aloha(task: str):
    os.environ.setdefault("MUJOCO_GL", "egl")  # dm_control renders every observation; its users set this
    import gym_aloha  # noqa: F401 - registers its ids

    return gymnasium.make(f"gym_aloha/Aloha{task}-v0")


def aloha_insertion():
    return _aloha("Insertion")


def aloha_transfer_cube():
    return _aloha("TransferCube")
