"""`ScriptedExpert`: a closed-loop controller for every task family, from privileged state.

Each call re-plans from the current world: pick = go above the block at carry
height, descend with suction on until it holds, lift; place = carry over the goal,
lower until the block rests on its surface, release. A dropped or misplaced block
is simply picked again. `noise` (0 = perfect, 1 = poor) degrades it for
mixed-quality data: each step the motion is replaced by a random one with
probability `0.3 * noise`, jittered by Gaussian noise of std `0.1 * noise`, and
while carrying the suction drops out with probability `0.05 * noise`.
"""

from __future__ import annotations

import numpy as np

from capsule_rollout.tabletop.scene import BLOCK_HALF, CUP_HALF_HEIGHT
from capsule_rollout.tabletop.tabletop_env import MAX_DELTA, TabletopEnv
from capsule_rollout.tabletop.tasks import Subtask, World

CARRY_Z = 0.15  # EE height for travel (m)
CLEAR_Z = 0.11  # below this, rise before travelling sideways
ALIGN_XY = 0.008  # xy error (m) under which the EE descends


class ScriptedExpert:
    """Acts for `env` (a `TabletopEnv`, or a gymnasium wrapper of one)."""

    def __init__(self, env, *, noise: float = 0.0, seed: int | None = None) -> None:
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        self.env: TabletopEnv = getattr(env, "unwrapped", env)
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.intended = np.zeros(4, np.float32)

    def act(self) -> np.ndarray:
        """The next action `(4,) float32` for the env's current state (perturbed by `noise`).

        The unperturbed action is kept in `self.intended` (what a DART-style
        dataset labels the step with).
        """
        env = self.env
        world = env.world()
        subtask = env.subtasks[min(env.subtask_index, len(env.subtasks) - 1)]
        return self._act(world, *self.plan(world, subtask))

    def wait(self) -> np.ndarray:
        """The next action once the plan is done but the episode goes on (a coached demonstration, whose env waits
        for another goal): let go and rise to the travel height where it is. (`act` would pick the placed block up
        again: its plan for a place subtask starts by grasping the block.)"""
        world = self.env.world()
        return self._act(world, np.array([world.ee[0], world.ee[1], CARRY_Z]), False)

    def _act(self, world: World, target: np.ndarray, suction: bool) -> np.ndarray:
        action = np.empty(4)
        action[:3] = np.clip((target - world.ee) / MAX_DELTA, -1.0, 1.0)
        action[3] = 1.0 if suction else -1.0
        self.intended = action.astype(np.float32)
        if self.noise:
            if self.rng.random() < 0.3 * self.noise:
                action[:3] = self.rng.uniform(-1.0, 1.0, 3)
            action[:3] += self.rng.normal(0.0, 0.1 * self.noise, 3)
            if world.holding is not None and self.rng.random() < 0.05 * self.noise:
                action[3] = -1.0
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def plan(self, world: World, subtask: Subtask) -> tuple[np.ndarray, bool]:
        """(EE target position, suction on) for the current subtask."""
        ee = world.ee
        if world.holding is not None and world.holding != subtask.block:
            return np.array([ee[0], ee[1], ee[2] - 0.02]), False  # wrong block: let it go
        if world.holding != subtask.block:
            return self._reach(world, subtask.block)
        if subtask.goal is None:
            return np.array([ee[0], ee[1], CARRY_Z]), True  # held: lift
        return self._place(world, subtask)

    def _travel(self, ee: np.ndarray, xy: np.ndarray) -> np.ndarray:
        if ee[2] < CLEAR_Z and np.linalg.norm(ee[:2] - xy) > 2 * ALIGN_XY:
            return np.array([ee[0], ee[1], CARRY_Z])  # rise first: do not sweep other blocks
        return np.array([xy[0], xy[1], CARRY_Z])

    def _reach(self, world: World, block: str) -> tuple[np.ndarray, bool]:
        pos = world.blocks[block]
        if np.linalg.norm(world.ee[:2] - pos[:2]) > ALIGN_XY:
            return self._travel(world.ee, pos[:2]), False
        top = pos[2] + BLOCK_HALF
        return np.array([pos[0], pos[1], top + CUP_HALF_HEIGHT]), True

    def _place(self, world: World, subtask: Subtask) -> tuple[np.ndarray, bool]:
        ee, block = world.ee, world.blocks[subtask.block]
        goal_xy = subtask.goal.target_xy(world)
        ee_goal = goal_xy + (ee[:2] - block[:2])  # the block may hang off-centre
        if np.linalg.norm(block[:2] - goal_xy) > ALIGN_XY:
            return self._travel(ee, ee_goal), True
        rest = subtask.goal.surface_z(world) + BLOCK_HALF  # block centre when resting
        height = block[2] - rest
        if height < 0.004:
            return np.array([ee[0], ee[1], ee[2]]), False  # resting: release
        return np.array([ee_goal[0], ee_goal[1], ee[2] - height - 0.003]), True
