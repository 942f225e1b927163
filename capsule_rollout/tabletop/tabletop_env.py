"""`TabletopEnv`: language-conditioned pick-and-place tasks (gymnasium API) with a capsule.

Control: 10 Hz; each step runs 50 physics steps of 2 ms.
Action: `(4,) float32` in [-1, 1]: `[dx, dy, dz, suction]`. The first three move
the gantry's target by up to `MAX_DELTA` = 3 cm per step along world x (right), y
(away from the front camera) and z (up), clipped to the workspace
x, y in [-0.25, 0.25] m, z in [0.03, 0.30] m; suction is on while `action[3] > 0`.
Observation (dict): `image_<camera>` `(H, W, 3) uint8` per configured camera
(none in state-only mode), `state` `(8,) float32` = EE position (m), EE velocity
(m/s), suction on (0/1), holding a block (0/1), `privileged` `(46,) float32` = the
simulator's own state that a robot's sensors do not give (read from the MuJoCo state its
capsule holds: EE position and velocity, suction, which block is held (one-hot), each
block's position, orientation quaternion and linear velocity, each pad's x, y; for a
critic that may read it, never for the policy), and `instruction` (text).
Reward: -1 per step, 0 on the success step, which terminates the episode;
`info["success"]`, the current subtask and its progress are in `info`.

It implements the rollout protocol's env side (`envs.rollout_env.RolloutEnv`): the task id
is the family name. As a `CapsuleComponent` ("env") it declares: the MuJoCo `mjSTATE_INTEGRATION`
state (qpos, qvel, act, ctrl, mocap, warm-start, time...), its RNG, its step and
subtask counters and the task ids, so a restore reproduces the following
trajectory bit for bit, images included.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, host_arrays
from capsule_rollout.capsules.rng_state import PCG64_WORDS, pack_pcg64, unpack_pcg64
from capsule_rollout.envs.offscreen_renderer import OffscreenRenderer
from capsule_rollout.envs.rollout_env import ArraySpec, ObservationSpec, image_key
from capsule_rollout.tabletop.phrasing import phrase
from capsule_rollout.tabletop.scene import (
    BLOCK_HALF,
    BLOCKS,
    EE_HOME_Z,
    PADS,
    SPAWN_HALF,
    TIMESTEP,
    WORKSPACE_HIGH,
    WORKSPACE_LOW,
    SceneConfig,
    scene_xml,
)
from capsule_rollout.tabletop.tasks import FAMILIES, PARAM_SLOTS, Subtask, TaskParams, World, family_index

CONTROL_HZ = 10
SUBSTEPS = round(1.0 / CONTROL_HZ / TIMESTEP)
MAX_DELTA = 0.03  # m of target motion per step at |action| = 1
TRACKING_SLACK = 0.02  # the servo target never leads the EE by more than this (m)
STATE_DIM = 8
# EE position (m), EE velocity (m/s, clipped), suction, holding
STATE_LOW = np.array([-0.3, -0.3, 0.0, -2.0, -2.0, -2.0, 0.0, 0.0], dtype=np.float32)
STATE_HIGH = np.array([0.3, 0.3, 0.36, 2.0, 2.0, 2.0, 1.0, 1.0], dtype=np.float32)
ACTION_DIM = 4
PRIVILEGED_KEY = "privileged"
PRIVILEGED_NAMES = ("ee_x", "ee_y", "ee_z", "ee_vx", "ee_vy", "ee_vz", "suction_on",
                    *(f"holding_{c}" for c in BLOCKS),
                    *(f"{c}_{v}" for c in BLOCKS for v in ("x", "y", "z", "qw", "qx", "qy", "qz", "vx", "vy", "vz")),
                    *(f"pad_{c}_{v}" for c in PADS for v in ("x", "y")))
PRIVILEGED_DIM = len(PRIVILEGED_NAMES)
DIMENSION_NAMES = {  # the state and action, dimension by dimension (the module docstring); kept with stores
    "state": ("ee_x", "ee_y", "ee_z", "ee_vx", "ee_vy", "ee_vz", "suction_on", "holding"),
    "action": ("dx", "dy", "dz", "suction"),
    PRIVILEGED_KEY: PRIVILEGED_NAMES,
}
CAMERAS = ("front", "top")
INSTRUCTION_CHARSET = string.ascii_letters + string.digits + " ,.'-"
_STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION


class TabletopEnv(gym.Env, BufferComponent):
    """One tabletop task family; the task instance and layout come from `reset(seed=...)`."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": CONTROL_HZ}
    restorable = True
    control_hz = CONTROL_HZ  # what the env says of itself (`envs.describe_env`), kept with its stores
    dimension_names = DIMENSION_NAMES

    def __init__(
        self,
        family: str = "pick_place",
        *,
        cameras: tuple[str, ...] = ("front",),
        image_size: int = 64,
        max_steps: int | None = None,
        render_mode: str | None = None,
        render_size: int = 256,
        scene: SceneConfig = SceneConfig(),
    ) -> None:
        BufferComponent.__init__(self)
        self.name = "env"
        self.family = FAMILIES[family_index(family)]
        self.family_id = family_index(family)
        cameras = tuple(cameras)
        unknown = [c for c in cameras if c not in CAMERAS]
        if unknown:
            raise ValueError(f"unknown camera(s) {unknown}; available: {list(CAMERAS)} (or () for state-only)")
        if not 16 <= image_size <= 256:
            raise ValueError(f"image_size must be within 16..256 pixels, got {image_size}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.cameras, self.image_size, self.render_mode, self.render_size = cameras, image_size, render_mode, render_size
        self.max_steps = max_steps or self.family.max_steps
        self.scene_config = scene
        self._xml = scene_xml(scene, max_image=max(image_size, render_size))
        self.model = mujoco.MjModel.from_xml_string(self._xml)
        self.data = mujoco.MjData(self.model)
        self._ids()
        self._renderers: dict[int, OffscreenRenderer] = {}
        self.images_wanted = True
        self._warmstart = np.zeros(self.model.nv)  # the restored warm-start, kept across mj_forward
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        spaces: dict[str, gym.spaces.Space] = {
            image_key(c): gym.spaces.Box(0, 255, (image_size, image_size, 3), np.uint8) for c in cameras
        }
        spaces["state"] = gym.spaces.Box(STATE_LOW, STATE_HIGH, (STATE_DIM,), np.float32)
        # positions (m), quaternions, velocities (m/s) and flags all lie well within +-10
        spaces[PRIVILEGED_KEY] = gym.spaces.Box(-10.0, 10.0, (PRIVILEGED_DIM,), np.float32)
        spaces["instruction"] = gym.spaces.Text(max_length=160, charset=INSTRUCTION_CHARSET)
        self.observation_space = gym.spaces.Dict(spaces)
        self.observation_spec = ObservationSpec.of(state_dim=STATE_DIM, cameras=cameras, image_size=image_size,
                                                   **{PRIVILEGED_KEY: ArraySpec((PRIVILEGED_DIM,), np.float32)})
        self._fingerprint = {
            "model_sha256": hashlib.sha256(self._xml.encode()).hexdigest()[:32],
            "mujoco": mujoco.__version__,
            "family": self.family.name,
            "control": f"{CONTROL_HZ}Hz x{SUBSTEPS} max_delta={MAX_DELTA}",
        }
        self.params = TaskParams(self.family_id)
        self.subtasks: list[Subtask] = self.family.subtasks(self.params)
        self.steps = 0
        self.subtask_index = 0
        self._reset_called = False

    def _ids(self) -> None:
        m = self.model
        self._ee_body = m.body("ee").id
        self._cup = m.geom("cup").id
        self._block_geom = {m.geom(f"block_{c}").id: c for c in BLOCKS}
        self._block_qpos = {c: m.jnt_qposadr[m.joint(f"block_{c}").id] for c in BLOCKS}
        self._pad_mocap = {c: m.body_mocapid[m.body(f"pad_{c}").id] for c in PADS}
        self._ee_qpos = [m.jnt_qposadr[m.joint(j).id] for j in ("ee_x", "ee_y", "ee_z")]
        self._ee_dof = [m.jnt_dofadr[m.joint(j).id] for j in ("ee_x", "ee_y", "ee_z")]
        self._block_dof = {c: m.jnt_dofadr[m.joint(f"block_{c}").id] for c in BLOCKS}

    # -- gymnasium API ------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if options:
            raise ValueError(f"reset options are not supported (got {sorted(options)}); the seed decides the task")
        rng = self.np_random
        for _ in range(200):
            self.params = self.family.sample(rng, self.family_id)
            self.subtasks = self.family.subtasks(self.params)
            self._place_objects(rng)
            if self.family.feasible(self.params, self.world()):
                break
        else:
            raise RuntimeError(f"no feasible {self.family.name} layout in 200 draws; widen the spawn area")
        self.steps = 0
        self.subtask_index = 0
        self._reset_called = True
        return self.observe(), self.info()

    def step(self, action: np.ndarray):
        if not self._reset_called:
            raise RuntimeError("call reset() before step()")
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (ACTION_DIM,):
            raise ValueError(f"action must have shape ({ACTION_DIM},) = [dx, dy, dz, suction], got {np.shape(action)}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"action has non-finite values {a.tolist()}; refusing to move the robot")
        self._apply(np.clip(a, -1.0, 1.0))
        mujoco.mj_step(self.model, self.data, nstep=SUBSTEPS)  # one call: the GIL is released for all of it
        # mj_step leaves positions-derived quantities (body poses, contacts) one substep
        # stale; recompute them so observations and predicates see the current state,
        # exactly as after a capsule restore (which also ends in mj_forward)
        mujoco.mj_forward(self.model, self.data)
        self.steps += 1
        world = self.world()
        self._advance_subtask(world)
        success = self.family.success(self.params, world)
        terminated = success
        truncated = (not success) and self.steps >= self.max_steps
        return self.observe(world), (0.0 if success else -1.0), terminated, truncated, self.info(world, success)

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        return self._renderer(self.render_size).render(self.data, "front")

    def close(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()

    # -- observations -------------------------------------------------------------
    def observe(self, world: World | None = None) -> dict[str, Any]:
        """The observation of the current state; without its images while `images_wanted` is False (a host
        that reads no image at the next step says so: rendering is a third of a step on a CPU). `world`: the
        current state's `world()` where the caller has it (a step has, for its predicates)."""
        obs: dict[str, Any] = {
            image_key(c): self._renderer(self.image_size).render(self.data, c).copy() for c in self.cameras
        } if self.images_wanted else {}
        world = world if world is not None else self.world()
        obs["state"] = self.proprio(world)
        obs[PRIVILEGED_KEY] = self.privileged(world)
        obs["instruction"] = self.instruction
        return obs

    def privileged(self, world: World | None = None) -> np.ndarray:
        """`(PRIVILEGED_DIM,) float32`: the sim's own state a robot's sensors do not give (`PRIVILEGED_NAMES`),
        read from the MuJoCo state the env's capsule holds."""
        d = self.data
        world = world if world is not None else self.world()
        parts = [world.ee, d.qvel[self._ee_dof], [float(d.ctrl[3] > 0.5)],
                 [float(world.holding == c) for c in BLOCKS]]
        for c in BLOCKS:
            q, v = self._block_qpos[c], self._block_dof[c]
            parts += [d.qpos[q: q + 7], d.qvel[v: v + 3]]
        parts += [world.pads[c][:2] for c in PADS]
        return np.concatenate(parts).astype(np.float32)

    def proprio(self, world: World | None = None) -> np.ndarray:
        d = self.data
        ee = self._ee_pos()
        vel = d.qvel[self._ee_dof]
        suction = float(d.ctrl[3] > 0.5)
        holding = float((world or self.world()).holding is not None)
        return np.clip(np.array([*ee, *vel, suction, holding], dtype=np.float32), STATE_LOW, STATE_HIGH)

    @property
    def instruction(self) -> str:
        return self.family.instruction(self.params)

    @property
    def task(self) -> str:
        return self.family.name

    @property
    def subtask_texts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.subtasks)

    def expert(self):
        """The scripted expert's `act` for this env (a teleoperator for takeovers)."""
        from capsule_rollout.tabletop.scripted_expert import ScriptedExpert

        return ScriptedExpert(self).act

    def phrase(self, text: str, phrasing: str, index: int = 0) -> str:
        """`text` said the `phrasing` way (`tabletop.phrasing`: canonical, train, heldout): the planner's words."""
        return phrase(text, phrasing, index=index)

    def success(self, info: Mapping[str, Any]) -> bool:
        return bool(info["success"])

    def info(self, world: World | None = None, success: bool | None = None) -> dict[str, Any]:
        world = world if world is not None else self.world()
        idx = min(self.subtask_index, len(self.subtasks) - 1)
        return {
            "success": self.family.success(self.params, world) if success is None else success,
            "subtask_id": idx,
            "subtask": self.subtasks[idx].text,
            "subtask_progress": float(self.subtasks[idx].progress(world)),
            "steps": self.steps,
        }

    def _renderer(self, size: int) -> OffscreenRenderer:
        if size not in self._renderers:
            self._renderers[size] = OffscreenRenderer(self.model, size, size)
        return self._renderers[size]

    # -- world and task -----------------------------------------------------------
    def _ee_pos(self) -> np.ndarray:
        q = self.data.qpos[self._ee_qpos]
        return np.array([q[0], q[1], q[2] + EE_HOME_Z])

    def world(self) -> World:
        """Privileged positions for predicates and the scripted expert."""
        d = self.data
        blocks = {c: d.qpos[adr : adr + 3].copy() for c, adr in self._block_qpos.items()}
        pads = {c: d.mocap_pos[i].copy() for c, i in self._pad_mocap.items()}
        holding = None
        if d.ctrl[3] > 0.5:
            for con in d.contact[: d.ncon]:
                if self._cup in (con.geom1, con.geom2):
                    other = con.geom2 if con.geom1 == self._cup else con.geom1
                    if other in self._block_geom and con.dist < 0.012:
                        holding = self._block_geom[other]
                        break
        return World(self._ee_pos(), blocks, pads, holding)

    def subtask_progress(self) -> list[float]:
        """Progress (0..1) of every subtask in the current state."""
        world = self.world()
        return [1.0 if i < self.subtask_index else s.progress(world) for i, s in enumerate(self.subtasks)]

    def _advance_subtask(self, world: World) -> None:
        # Latched: a pick stays done once its block is placed (its predicate turns false).
        while self.subtask_index < len(self.subtasks) and self.subtasks[self.subtask_index].done(world):
            self.subtask_index += 1

    def _apply(self, a: np.ndarray) -> None:
        d = self.data
        ee = self._ee_pos()
        target = d.ctrl[:3] + np.array([0.0, 0.0, EE_HOME_Z]) + a[:3] * MAX_DELTA
        target = np.clip(target, ee - TRACKING_SLACK, ee + TRACKING_SLACK)
        target = np.clip(target, WORKSPACE_LOW, WORKSPACE_HIGH)
        d.ctrl[:3] = target - np.array([0.0, 0.0, EE_HOME_Z])
        d.ctrl[3] = 1.0 if a[3] > 0 else 0.0

    def _place_objects(self, rng: np.random.Generator) -> None:
        m, d = self.model, self.data
        mujoco.mj_resetData(m, d)
        blocks = _spread(rng, len(BLOCKS), 0.08, [])
        pads = _spread(rng, len(PADS), 0.12, blocks, clearance=0.08)
        for c, xy in zip(BLOCKS, blocks):
            adr = self._block_qpos[c]
            yaw = rng.uniform(0.0, np.pi / 2)
            d.qpos[adr : adr + 7] = [xy[0], xy[1], BLOCK_HALF, np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]
        for c, xy in zip(PADS, pads):
            d.mocap_pos[self._pad_mocap[c]] = [xy[0], xy[1], 0.0005]
        ee = [rng.uniform(-0.1, 0.1), rng.uniform(-0.1, 0.1), 0.2 - EE_HOME_Z]
        d.qpos[self._ee_qpos] = ee
        d.ctrl[:3] = ee
        d.ctrl[3] = 0.0
        mujoco.mj_forward(m, d)

    # -- capsule component --------------------------------------------------------
    def buffer_specs(self) -> list[BufferSpec]:
        n = mujoco.mj_stateSize(self.model, _STATE_SPEC)
        return [
            BufferSpec("physics", (n,), torch.float64, doc="mjSTATE_INTEGRATION state"),
            BufferSpec("rng", (PCG64_WORDS,), torch.int64, doc="PCG64 state words of env.np_random"),
            BufferSpec("counters", (3,), torch.int64, doc="steps, subtask index, reset called"),
            BufferSpec("task", (PARAM_SLOTS,), torch.int64, doc="TaskParams of the episode"),
        ]

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def before_snapshot(self) -> None:
        b = self.buffers
        mujoco.mj_getState(self.model, self.data, b["physics"].numpy(), _STATE_SPEC)
        pack_pcg64(self.np_random, b["rng"].numpy().view(np.uint64))
        b["counters"].numpy()[:] = [self.steps, self.subtask_index, int(self._reset_called)]
        b["task"].numpy()[:] = self.params.to_array()

    def after_restore(self) -> None:
        b = self.buffers
        mujoco.mj_setState(self.model, self.data, b["physics"].numpy(), _STATE_SPEC)
        # mujoco 3.x's mj_forward overwrites qacc_warmstart (4.0's does not): keep the restored one, else the
        # state after the next steps differs from the live run's in the last bits
        np.copyto(self._warmstart, self.data.qacc_warmstart)
        mujoco.mj_forward(self.model, self.data)
        np.copyto(self.data.qacc_warmstart, self._warmstart)
        unpack_pcg64(self.np_random, b["rng"].numpy().view(np.uint64))
        self.steps, self.subtask_index, reset_called = (int(x) for x in b["counters"].numpy())
        self._reset_called = bool(reset_called)
        self.params = TaskParams.from_array(b["task"].numpy())
        self.subtasks = self.family.subtasks(self.params)

    def check_restore(self, view: Mapping[str, torch.Tensor]) -> None:
        b = host_arrays(view)  # numpy views kept with the capsule: no torch call on a restore's path
        if not np.isfinite(b["physics"]).all():
            raise ValueError("the capsule holds non-finite physics state (NaN or infinity): refusing it")
        family = int(b["task"][0])
        if family != self.family_id:
            held = FAMILIES[family].name if 0 <= family < len(FAMILIES) else f"family #{family}"
            raise ValueError(f"capsule holds a {held} task, this env runs {self.family.name}")


def _spread(rng: np.random.Generator, n: int, min_gap: float, avoid: list[np.ndarray], clearance: float = 0.0):
    """`n` points in the spawn square, `min_gap` apart and `clearance` from `avoid`."""
    for _ in range(1000):
        pts = rng.uniform(-SPAWN_HALF, SPAWN_HALF, size=(n, 2))
        gaps = [np.linalg.norm(pts[i] - pts[j]) for i in range(n) for j in range(i + 1, n)]
        far = [np.linalg.norm(p - q) for p in pts for q in avoid]
        if min(gaps, default=1.0) >= min_gap and min(far, default=1.0) >= clearance:
            return list(pts)
    raise RuntimeError("could not place objects apart; the spawn area is too small for the gaps asked")
