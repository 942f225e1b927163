"""`LeRobotBackend`: any LeRobot `Robot` (SO-100/101, Koch, OMX, LeKiwi, ...) behind the bridge, with an optional
LeRobot `Teleoperator` (a leader arm, a gamepad) for takeovers; `LeRobotLimits`, what the robot side allows it.

Features map onto the bridge as LeRobot names them: every scalar observation feature, in the robot's order, is a
component of `state` (S,) float32; every `(H, W, 3)` feature is a camera, `image_<name>` (H, W, 3) uint8; every
action feature, in the robot's order, is a component of `action` (A,) float32, sent back to `send_action` by name.
The bounds are the calibration's (as LeRobot stores it: each motor's range, in the unit its bus normalises to:
degrees, -100..100 or 0..100), the rate limit a whole range per second, the control rate the slowest camera's fps
(30 Hz without one); `LeRobotLimits` can only tighten them. The server's safety layer enforces them on every
action, the policy's and the leader's alike. LeRobot is imported only by `from_configs`: the rest takes the
devices as objects, so this module imports with numpy alone.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from capsule_rollout.robot_side.backend import RobotBackend

DEFAULT_HZ = 30.0  # LeRobot's recording default (`lerobot-record --dataset.fps`)
NORM_RANGES = {"range_m100_100": (-100.0, 100.0), "range_0_100": (0.0, 100.0)}


@dataclass(frozen=True)
class LeRobotLimits:
    """What the robot side allows a LeRobot robot, within what its features and calibration give (only tighter)."""

    control_hz: float | None = None
    """Control rate in Hz (None: the slowest camera's fps, else 30); with cameras, at most the slowest one's fps."""
    image_size: tuple[int, int] | None = None
    """(H, W) every camera image is resized to (nearest pixel) before it is sent; None: the cameras' own size."""
    low: Mapping[str, float] = field(default_factory=dict)
    """Lowest value of named action features (e.g. `shoulder_pan.pos`), at or above the calibrated one."""
    high: Mapping[str, float] = field(default_factory=dict)
    """Highest value of named action features, at or below the calibrated one."""
    max_speed: float | Mapping[str, float] | None = None
    """Largest change of an action component per second, in its unit (one number: all; None: a whole range/s)."""
    home: Mapping[str, float] = field(default_factory=dict)
    """Where each reset moves the named action features (within the rate limit); empty: the robot stays put."""
    task: str = "task"
    """Name of the task (the episodes' `task`)."""
    instruction: str = ""
    """The instruction the policy is given (empty: the task's name)."""
    realtime: bool = True
    """Pace actions to the control rate, one per period, as a robot's controller takes them (off: benchmarks)."""

    def __post_init__(self) -> None:
        if self.control_hz is not None and not self.control_hz > 0:
            raise ValueError(f"control_hz must be > 0, got {self.control_hz!r}")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise ValueError(f"image_size is (H, W) in pixels, got {self.image_size!r}")
        speeds = self.max_speed.values() if isinstance(self.max_speed, Mapping) else [self.max_speed]
        if any(s is not None and not s > 0 for s in speeds):
            raise ValueError(f"max_speed must be > 0, got {self.max_speed!r}")


def calibrated_ranges(robot: Any) -> dict[str, tuple[float, float]]:
    """`{"<motor>.pos": (low, high)}` from the calibration LeRobot loaded for `robot` (its motor bus's ranges, in
    the unit the bus normalises to); empty for a robot without a calibrated motor bus."""
    bus = getattr(robot, "bus", None)
    calibration = getattr(bus, "calibration", None) or getattr(robot, "calibration", None) or {}
    motors = getattr(bus, "motors", None) or {}
    resolution = getattr(bus, "model_resolution_table", None) or {}
    ranges = {}
    for name, motor in motors.items():
        cal = calibration.get(name)
        mode = str(getattr(getattr(motor, "norm_mode", None), "value", getattr(motor, "norm_mode", "")))
        if cal is None or cal.range_max == cal.range_min:
            continue
        if mode in NORM_RANGES:
            ranges[f"{name}.pos"] = NORM_RANGES[mode]
        elif mode == "degrees" and getattr(motor, "model", None) in resolution:
            mid, per_tick = (cal.range_min + cal.range_max) / 2, 360.0 / (resolution[motor.model] - 1)
            ranges[f"{name}.pos"] = ((cal.range_min - mid) * per_tick, (cal.range_max - mid) * per_tick)
    return ranges


class LeRobotBackend(RobotBackend):
    """A LeRobot `Robot` (and optionally a `Teleoperator`) as a bridge backend; a context manager that connects
    both and disconnects them (the server also closes it, from its robot thread, when it stops)."""

    def __init__(self, robot: Any, teleop: Any | None = None, limits: LeRobotLimits = LeRobotLimits()) -> None:
        self.robot, self.teleop, self.limits = robot, teleop, limits
        obs_ft, act_ft = dict(robot.observation_features), dict(robot.action_features)
        self.state_keys = [k for k, v in obs_ft.items() if not isinstance(v, tuple)]
        camera_ft = {k: v for k, v in obs_ft.items() if isinstance(v, tuple)}
        odd = {k: v for k, v in camera_ft.items() if len(v) != 3 or v[2] != 3}
        odd.update({k: v for k, v in act_ft.items() if isinstance(v, tuple)})
        if odd:
            raise ValueError(f"features the bridge cannot carry (scalars and (H, W, 3) images only): {odd}")
        self.action_keys = list(act_ft)
        if teleop is not None and set(teleop.action_features) != set(self.action_keys):
            raise ValueError(f"the teleoperator's action features {sorted(teleop.action_features)} are not the "
                             f"robot's {sorted(self.action_keys)}: use a leader of the same kind as the follower")
        self.name = f"{getattr(robot, 'name', type(robot).__name__)}:{getattr(robot, 'id', None) or ''}".rstrip(":")
        self.task = limits.task
        self.instruction = limits.instruction or limits.task
        self.cameras = tuple(camera_ft)
        self.state_dim = len(self.state_keys)
        self.image_shape = self._image_shape(camera_ft)
        self.control_hz = self._control_hz()
        self.action_low, self.action_high = self._bounds(calibrated_ranges(robot))
        self.max_rate = self._max_rate()
        self.steps = 0
        self._next_tick = 0.0
        self._last_obs: dict | None = None

    @classmethod
    def from_configs(cls, robot_config: Any, teleop_config: Any | None = None,
                     limits: LeRobotLimits = LeRobotLimits()) -> LeRobotBackend:
        """The robot (and teleoperator) LeRobot's own factories make from their configs (`--robot.type=...`)."""
        from lerobot.robots import make_robot_from_config
        from lerobot.teleoperators import make_teleoperator_from_config

        robot = make_robot_from_config(robot_config)
        teleop = make_teleoperator_from_config(teleop_config) if teleop_config is not None else None
        return cls(robot, teleop, limits)

    # -- what the features, the calibration and the limits give ------------------------------
    def _image_shape(self, camera_ft: dict) -> tuple[int, int]:
        if self.limits.image_size is not None:
            return tuple(int(x) for x in self.limits.image_size)
        shapes = {tuple(v[:2]) for v in camera_ft.values()}
        if len(shapes) > 1:
            raise ValueError(f"the cameras' images differ in size ({camera_ft}): give one size they are all resized "
                             "to (LeRobotLimits.image_size, --image_size H W)")
        return shapes.pop() if shapes else (0, 0)

    def _control_hz(self) -> float:
        cameras = getattr(getattr(self.robot, "config", None), "cameras", None) or {}
        fps = [float(c.fps) for c in cameras.values() if getattr(c, "fps", None)]
        top = min(fps) if fps else None
        hz = self.limits.control_hz or top or DEFAULT_HZ
        if top is not None and hz > top:
            raise ValueError(f"control_hz {hz:g} is faster than the slowest camera ({top:g} fps): at most {top:g}")
        return float(hz)

    def _check_names(self, values: Mapping[str, Any], what: str) -> None:
        for name in values:
            if name not in self.action_keys:
                close = difflib.get_close_matches(name, self.action_keys, n=1)
                raise ValueError(f"{what}: {name!r} is not an action feature of this robot"
                                 + (f" (did you mean {close[0]!r}?)" if close else f"; it has {self.action_keys}"))

    def _bounds(self, calibrated: dict[str, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
        lim = self.limits
        self._check_names(lim.low, "low")
        self._check_names(lim.high, "high")
        self._check_names(lim.home, "home")
        low, high = [], []
        for key in self.action_keys:
            lo, hi = calibrated.get(key, (None, None))
            if key in lim.low:
                if lo is not None and lim.low[key] < lo:
                    raise ValueError(f"low {key}={lim.low[key]:g} is below the calibrated {lo:g}: limits only tighten")
                lo = lim.low[key]
            if key in lim.high:
                if hi is not None and lim.high[key] > hi:
                    raise ValueError(f"high {key}={lim.high[key]:g} is above the calibrated {hi:g}: limits only "
                                     "tighten")
                hi = lim.high[key]
            if lo is None or hi is None:
                raise ValueError(f"action feature {key!r} has no range: the robot has no calibration for it (calibrate "
                                 f"it with lerobot-calibrate, same --robot.id), or give both --low {key}=... and "
                                 f"--high {key}=...")
            if not lo < hi:
                raise ValueError(f"action feature {key!r}: low {lo:g} is not below high {hi:g}")
            low.append(lo)
            high.append(hi)
        return np.asarray(low, np.float32), np.asarray(high, np.float32)

    def _max_rate(self) -> np.ndarray:
        speed = self.limits.max_speed
        per_s = (self.action_high - self.action_low).astype(np.float64)  # a whole range per second
        if isinstance(speed, Mapping):
            self._check_names(speed, "max_speed")
            per_s = np.asarray([min(speed.get(k, np.inf), r) for k, r in zip(self.action_keys, per_s)])
        elif speed is not None:
            per_s = np.minimum(per_s, float(speed))
        return (per_s / self.control_hz).astype(np.float32)

    # -- the devices ---------------------------------------------------------------------------
    def __enter__(self) -> LeRobotBackend:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def connect(self) -> None:
        """Connect the robot and the teleoperator as calibrated (never calibrate here: a server has no one to ask)."""
        for device in (self.robot, self.teleop):
            if device is None or device.is_connected:
                continue
            device.connect(calibrate=False)
            if not device.is_calibrated:
                device.disconnect()
                raise ValueError(f"{device} is not calibrated: run lerobot-calibrate for it first (same type, port and "
                                 "id), then start the robot side again")

    def close(self) -> None:
        for device in (self.teleop, self.robot):
            if device is not None and device.is_connected:
                device.disconnect()

    # -- the backend hooks (the server's robot thread) -------------------------------------------
    def reset(self, seed: int | None) -> str:
        self.connect()  # again after an e-stop
        self.steps, self._next_tick = 0, 0.0
        if self.limits.home:
            self._go_home()
        return self.instruction

    def _go_home(self) -> None:
        """Move the homed features to `limits.home` within the rate limit, one control period a step."""
        index = {k: i for i, k in enumerate(self.action_keys)}
        target = {k: float(np.clip(v, self.action_low[index[k]], self.action_high[index[k]]))
                  for k, v in self.limits.home.items()}
        obs = self.robot.get_observation()
        now = {k: float(obs.get(k, v)) for k, v in target.items()}
        steps = max(int(np.ceil(abs(target[k] - now[k]) / self.max_rate[index[k]])) for k in target)
        for _ in range(steps):
            now = {k: now[k] + float(np.clip(target[k] - now[k], -self.max_rate[index[k]], self.max_rate[index[k]]))
                   for k in target}
            self._pace()
            self.robot.send_action(dict(now))

    def present_action(self) -> np.ndarray | None:
        """The action that holds the robot where it is (the position features' present values), so the server's
        rate limit starts there at a reset; None when an action feature is not observed (a velocity)."""
        obs = self.robot.get_observation()
        if not all(k in obs for k in self.action_keys):
            return None
        return np.asarray([float(obs[k]) for k in self.action_keys], np.float32)

    def subtasks(self) -> list[str]:
        return []

    def observe(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        obs = self.robot.get_observation()
        self._last_obs = obs
        arrays = {f"image_{c}": self._resize(np.asarray(obs[c], np.uint8)) for c in self.cameras}
        arrays["state"] = np.asarray([obs[k] for k in self.state_keys], np.float32)
        fields = {"instruction": self.instruction, "subtask": "", "subtask_id": 0, "step": self.steps,
                  "success": False}
        return arrays, fields

    def _resize(self, image: np.ndarray) -> np.ndarray:
        h, w = self.image_shape
        if image.shape[:2] == (h, w):
            return image
        rows = (np.arange(h) * image.shape[0] // h)[:, None]
        cols = (np.arange(w) * image.shape[1] // w)[None, :]
        return np.ascontiguousarray(image[rows, cols])

    def _pace(self) -> None:
        if not self.limits.realtime:
            return
        now = time.monotonic()
        if now < self._next_tick:
            time.sleep(self._next_tick - now)
        self._next_tick = max(now, self._next_tick) + 1.0 / self.control_hz

    def apply(self, action: np.ndarray) -> np.ndarray:
        self._pace()
        goal = {k: float(v) for k, v in zip(self.action_keys, np.asarray(action, np.float64).tolist())}
        sent = self.robot.send_action(goal) or goal
        self.steps += 1
        return np.asarray([float(sent.get(k, goal[k])) for k in self.action_keys], np.float32)

    @property
    def has_teleop(self) -> bool:
        return self.teleop is not None

    def teleop_action(self) -> np.ndarray:
        if self.teleop is None:
            raise RuntimeError("this robot side has no teleoperator: start it with --teleop.type=... (a leader arm)")
        action = self.teleop.get_action()
        return np.asarray([float(action[k]) for k in self.action_keys], np.float32)

    def hold(self) -> None:
        """Stop where the robot is: position features get their present value as the goal, others (velocities) 0."""
        if not self.robot.is_connected:
            return
        obs = self.robot.get_observation()
        goal = {k: float(obs[k]) if k in obs else 0.0 for k in self.action_keys
                if k in obs or not k.endswith(".pos")}
        if goal:
            self.robot.send_action(goal)

    def estop(self) -> None:
        """Hold, then disconnect the robot (LeRobot's arms then turn their motors' torque off, as configured by
        `disable_torque_on_disconnect`); the next reset connects it again."""
        self.hold()
        if self.robot.is_connected:
            self.robot.disconnect()
