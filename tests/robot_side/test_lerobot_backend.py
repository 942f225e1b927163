"""LeRobotBackend over a robot shaped as LeRobot's are (features, a calibrated motor bus, `send_action` returning
what it sent), without LeRobot: features to the bridge's arrays, bounds from the calibration, limits that only
tighten, the server's safety layer over it, a leader's actions by name, its buttons as operator events."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from capsule_rollout.envs.robot_bridge import RobotClient
from capsule_rollout.robot_side import LeRobotBackend, LeRobotLimits, RobotServer, TeleopButtons, calibrated_ranges
from capsule_rollout.robot_side.operator import OperatorMix, RobotOperator, parse_event
from capsule_rollout.robot_side.operator_input import Kind, OperatorEvent, ScriptedOperator
from capsule_rollout.robot_side.serve import main as serve_main

DEG = 1024 * 360 / 4095  # a joint calibrated over ticks 1024..3072, in LeRobot's degrees


def motor(mode: str) -> SimpleNamespace:
    return SimpleNamespace(model="sts3215", norm_mode=SimpleNamespace(value=mode))


class FakeArm:
    """Two joints and a camera, as a LeRobot SO arm reports them; the hardware clips `elbow.pos` to +-10."""

    name, id = "fake_arm", "left"

    def __init__(self, fps: int = 15, calibrated: bool = True) -> None:
        self.config = SimpleNamespace(cameras={"front": SimpleNamespace(fps=fps)})
        cal = SimpleNamespace(range_min=1024, range_max=3072)
        self.bus = SimpleNamespace(motors={"elbow": motor("degrees"), "gripper": motor("range_0_100")},
                                   calibration={"elbow": cal, "gripper": cal} if calibrated else {},
                                   model_resolution_table={"sts3215": 4096})
        self.pos = {"elbow.pos": 0.0, "gripper.pos": 50.0}
        self.connected, self.sent = False, []

    observation_features = {"elbow.pos": float, "gripper.pos": float, "front": (8, 12, 3)}
    action_features = {"elbow.pos": float, "gripper.pos": float}
    is_calibrated = True

    @property
    def is_connected(self) -> bool:
        return self.connected

    def connect(self, calibrate: bool = True) -> None:
        self.connected = True

    def disconnect(self) -> None:
        self.connected = False

    def get_observation(self) -> dict:
        image = np.arange(8 * 12 * 3, dtype=np.uint8).reshape(8, 12, 3)
        return {**self.pos, "front": image}

    def send_action(self, action: dict) -> dict:
        sent = {k: (float(np.clip(v, -10, 10)) if k == "elbow.pos" else v) for k, v in action.items()}
        self.pos.update(sent)
        self.sent.append(sent)
        return sent


class FakeLeader:
    action_features = {"gripper.pos": float, "elbow.pos": float}  # another order: mapped by name

    def __init__(self) -> None:
        self.events, self.is_connected, self.is_calibrated = {}, False, True

    def connect(self, calibrate: bool = True) -> None:
        self.is_connected = True

    def disconnect(self) -> None:
        self.is_connected = False

    def get_action(self) -> dict:
        return {"gripper.pos": 20.0, "elbow.pos": -3.0}

    def get_teleop_events(self) -> dict:
        return dict(self.events)


def test_features_bounds_and_rates_come_from_the_robot_and_its_calibration():
    b = LeRobotBackend(FakeArm(), limits=LeRobotLimits(realtime=False))
    assert b.cameras == ("front",) and b.state_dim == 2 and b.image_shape == (8, 12) and b.control_hz == 15
    assert np.allclose(b.action_low, [-DEG, 0]) and np.allclose(b.action_high, [DEG, 100])
    assert np.allclose(b.max_rate, [2 * DEG / 15, 100 / 15])  # a whole range per second by default
    assert calibrated_ranges(FakeArm(calibrated=False)) == {}
    tight = LeRobotBackend(FakeArm(), limits=LeRobotLimits(control_hz=5, low={"elbow.pos": -45}, max_speed=10,
                                                           image_size=(4, 6), realtime=False))
    assert tight.action_low[0] == -45 and np.allclose(tight.max_rate, [2.0, 2.0]) and tight.control_hz == 5
    assert not tight.has_teleop
    with tight:
        tight.reset(seed=None)
        arrays, fields = tight.observe()
    assert arrays["image_front"].shape == (4, 6, 3) and arrays["state"].tolist() == [0.0, 50.0]
    assert fields["instruction"] == "task" and fields["step"] == 0


@pytest.mark.parametrize("limits, match", [
    (LeRobotLimits(low={"elbow.pos": -120}), "only tighten"),
    (LeRobotLimits(high={"elbo.pos": 5}), "did you mean 'elbow.pos'"),
    (LeRobotLimits(control_hz=60), "faster than the slowest camera"),
    (LeRobotLimits(low={"elbow.pos": 50}, high={"elbow.pos": 40}), "not below"),
])
def test_limits_only_tighten_and_name_what_is_wrong(limits, match):
    with pytest.raises(ValueError, match=match):
        LeRobotBackend(FakeArm(), limits=limits)


def test_a_robot_without_calibration_needs_bounds_given():
    with pytest.raises(ValueError, match="lerobot-calibrate"):
        LeRobotBackend(FakeArm(calibrated=False))
    b = LeRobotBackend(FakeArm(calibrated=False), limits=LeRobotLimits(low={"elbow.pos": -5, "gripper.pos": 0},
                                                                      high={"elbow.pos": 5, "gripper.pos": 1}))
    assert b.action_high.tolist() == [5, 1]
    with pytest.raises(ValueError, match="not the robot's"):
        LeRobotBackend(FakeArm(), SimpleNamespace(action_features={"x.vel": float}))


def test_the_server_over_it_acks_what_the_hardware_took_and_limits_from_where_the_robot_is():
    arm, leader = FakeArm(), FakeLeader()
    backend = LeRobotBackend(arm, leader, LeRobotLimits(max_speed=30, realtime=False))  # 2 degrees a step
    with backend, RobotServer(backend, operator=TeleopButtons(leader)) as server, \
            RobotClient(*server.address) as robot:
        assert robot.has_operator and robot.has_teleop and robot.robot == "fake_arm:left"
        robot.reset_to_initial()
        assert robot.teleop_action().tolist() == [-3.0, 20.0]  # the leader's, in the robot's order
        assert robot.send_action(np.array([50.0, 100.0])).tolist() == [2.0, 52.0]  # from the present (0, 50)
        acks = [robot.send_action(np.array([50.0, 52.0]))[0] for _ in range(6)]
        assert acks == [4.0, 6.0, 8.0, 10.0, 10.0, 10.0]  # the hardware clips at 10: the ack says what it took
        assert robot.operator_events() == []
        leader.events = {"is_intervention": True}
        robot.observe()
        leader.events = {"is_intervention": False, "success": True}
        robot.observe()
        robot.observe()  # still pressed: one END per press
        assert robot.operator_events() == ["takeover_on", "takeover_off", "end_success"]
        robot.estop()
        assert not arm.connected and arm.sent[-1] == {"elbow.pos": 10.0, "gripper.pos": 52.0}  # held, then off
        robot.reset_to_initial()
        assert arm.connected
    assert not arm.connected and not leader.is_connected


def test_teleop_buttons_map_lerobots_events_to_the_operators():
    leader = FakeLeader()
    buttons = TeleopButtons(leader)
    seen = []
    for events in ({"is_intervention": True}, {"is_intervention": True}, {"terminate_episode": True},
                   {"terminate_episode": True, "success": True}, {}, {"failure": True}, {"rerecord_episode": True}):
        leader.events = events
        seen.append([e.kind.value for e in buttons.poll(0)])
    assert seen == [["takeover_on"], [], ["takeover_off", "end_failure"], [], [], ["end_failure"], []]
    assert buttons.ignored == 1
    with pytest.raises(ValueError, match="no buttons"):
        TeleopButtons(object())


def test_robot_operator_and_operator_mix():
    assert parse_event("coach:go left") == OperatorEvent(Kind.COACH, "go left") and parse_event("dance") is None
    client = SimpleNamespace(queue=["end_success", "dance"])
    client.operator_events = lambda: [client.queue.pop(0) for _ in range(len(client.queue))]
    robot = RobotOperator(client)
    script = ScriptedOperator({1: OperatorEvent(Kind.TAKEOVER_ON)})
    mix = OperatorMix([script, robot])
    assert [e.kind for e in mix.poll(1)] == [Kind.TAKEOVER_ON, Kind.END_SUCCESS] and robot.unknown == ["dance"]
    assert mix.capsule_state() == (1,)
    mix.reset()
    mix.load_capsule_state((1,))
    assert mix.poll(1) == []
    with pytest.raises(ValueError, match="taken with other operators"):
        mix.load_capsule_state((1, 2))


def test_the_serve_command_names_what_is_missing(capsys):
    assert serve_main(["--port", "0"]) == 2
    assert "name the robot: --robot.type" in capsys.readouterr().err
    assert serve_main(["--backend", "tests.robot_side.test_lerobot_backend:FakeArm", "--port", "0"]) == 2
    assert "not a RobotBackend" in capsys.readouterr().err
    assert serve_main(["--backend", "tests.robot_side.test_lerobot_backend:FakeArm", "--max_speed", "5"]) == 2
    assert "sets its own limits" in capsys.readouterr().err
    assert serve_main(["--robot.type=so101_follower", "--low", "elbow.pos"]) == 2
    assert "expected NAME=NUMBER" in capsys.readouterr().err
    try:
        import lerobot  # noqa: F401
    except ImportError:  # this venv: the message says how to get it
        assert serve_main(["--robot.type=so101_follower"]) == 2
        assert "needs LeRobot in this environment" in capsys.readouterr().err


def test_a_robot_side_without_a_teleoperator_says_so():
    backend = LeRobotBackend(FakeArm(), limits=LeRobotLimits(realtime=False))
    with backend, RobotServer(backend) as server, RobotClient(*server.address) as robot:
        assert not robot.has_teleop and not robot.has_operator  # real_recap then records takeovers as ignored
