"""The scripted leader's config, registered as LeRobot's teleoperators' are."""

from __future__ import annotations

from dataclasses import dataclass

from lerobot.teleoperators import TeleoperatorConfig


@TeleoperatorConfig.register_subclass("scripted_leader")
@dataclass
class ScriptedLeaderConfig(TeleoperatorConfig):
    takeover: str = ""  # "FROM-TO;...": the button polls (get_teleop_events calls) with is_intervention held
    success_at: str = ""  # "N;...": polls at which success is pressed (for that poll only)
    failure_at: str = ""  # polls at which failure is pressed
    jump_at: int = -1  # the get_action call from which shoulder_lift is `jump` degrees further (too fast a move)
    jump: float = 60.0
    out_of_range_at: int = -1  # the get_action call whose shoulder_pan is 1000 degrees (out of range)
