"""`ScriptedLeader`: an SO-101 leader arm whose positions follow a ramp (with a jump and an out-of-range reading
where the config says) and whose buttons are pressed at scripted polls, as LeRobot's gamepad reports them."""

from __future__ import annotations

from lerobot.teleoperators import Teleoperator
from lerobot.teleoperators.utils import TeleopEvents

from tests.robot_side.lerobot_teleop.config_scripted_leader import ScriptedLeaderConfig

MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")


def _polls(text: str) -> set[int]:
    return {int(x) for x in text.split(";") if x}


class ScriptedLeader(Teleoperator):
    config_class = ScriptedLeaderConfig
    name = "scripted_leader"

    def __init__(self, config: ScriptedLeaderConfig) -> None:
        super().__init__(config)
        self.config = config
        self.connected = False
        self.actions = self.polls = 0
        self.held = set()
        for span in filter(None, config.takeover.split(";")):
            start, end = (int(x) for x in span.split("-"))
            self.held |= set(range(start, end))

    @property
    def action_features(self) -> dict:
        return {f"{m}.pos": float for m in MOTORS}

    @property
    def feedback_features(self) -> dict:
        return {}

    @property
    def is_connected(self) -> bool:
        return self.connected

    def connect(self, calibrate: bool = True) -> None:
        self.connected = True

    @property
    def is_calibrated(self) -> bool:
        return True

    def calibrate(self) -> None:
        pass

    def configure(self) -> None:
        pass

    def get_action(self) -> dict:
        k, c = self.actions, self.config
        self.actions += 1
        pos = {"shoulder_pan": 5.0 + 2.0 * k, "shoulder_lift": c.jump if 0 <= c.jump_at <= k else 0.0,
               "elbow_flex": 0.0, "wrist_flex": 0.0, "wrist_roll": 0.0, "gripper": 30.0}
        if k == c.out_of_range_at:
            pos["shoulder_pan"] = 1000.0
        return {f"{m}.pos": v for m, v in pos.items()}

    def get_teleop_events(self) -> dict:
        k = self.polls
        self.polls += 1
        return {TeleopEvents.IS_INTERVENTION: k in self.held, TeleopEvents.SUCCESS: k in _polls(self.config.success_at),
                TeleopEvents.FAILURE: k in _polls(self.config.failure_at), TeleopEvents.TERMINATE_EPISODE: False,
                TeleopEvents.RERECORD_EPISODE: False}

    def send_feedback(self, feedback: dict) -> None:
        pass

    def disconnect(self) -> None:
        self.connected = False
