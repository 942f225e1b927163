"""The robot side's command: serve a robot over the bridge, on the robot's computer.

A LeRobot robot, named as LeRobot's own commands name it (its config: type, port, id, cameras; the calibration
LeRobot stored for that id), with an optional teleoperator for takeovers:

    python -m capsule_rollout.robot_side.serve --port 5555 --token $TOKEN --host 0.0.0.0 \\
        --robot.type=so101_follower --robot.port=/dev/ttyACM0 --robot.id=my_follower \\
        --robot.cameras="{front: {type: opencv, index_or_path: 0, width: 640, height: 480, fps: 30}}" \\
        --teleop.type=so101_leader --teleop.port=/dev/ttyACM1 --teleop.id=my_leader

or a backend of your own (`--backend package.module:make_backend`, a callable returning a `RobotBackend`). It needs
numpy only (and LeRobot for a LeRobot robot): `pip install packaging/robot` installs it without torch, Ray or
MuJoCo. It prints `listening on HOST:PORT` once it serves, then serves until Ctrl-C, SIGTERM (what `kill`, systemd
and `docker stop` send) or `--seconds`; each stops it the same way: a running episode held, the backend closed, the
summary printed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import field, make_dataclass
from typing import Any

from capsule_rollout.import_path import resolve
from capsule_rollout.robot_side.backend import RobotBackend
from capsule_rollout.robot_side.lerobot_backend import LeRobotBackend, LeRobotLimits
from capsule_rollout.robot_side.operator import OperatorMix
from capsule_rollout.robot_side.operator_input import KeyboardOperator, OperatorSource
from capsule_rollout.robot_side.server import RobotServer
from capsule_rollout.robot_side.teleop_buttons import TeleopButtons

TOKEN_ENV = "CAPSULE_ROLLOUT_ROBOT_TOKEN"  # the token from the environment: it stays out of the process list
LEROBOT_PREFIXES = ("--robot.", "--teleop.")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m capsule_rollout.robot_side.serve", description=__doc__.split("\n")[0],
                                epilog="Every --robot.* and --teleop.* option goes to LeRobot's own parser.")
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (anything but loopback needs a token)")
    server.add_argument("--port", type=int, default=5555, help="port to listen on (0: any free one)")
    server.add_argument("--token", default=os.environ.get(TOKEN_ENV, ""),
                        help=f"shared token every client must present (default: ${TOKEN_ENV})")
    server.add_argument("--heartbeat_timeout_s", type=float, default=1.0,
                        help="a controller silent this long during an episode makes the robot hold")
    server.add_argument("--seconds", type=float, default=0.0, help="serve this long, then stop (0: until Ctrl-C or SIGTERM)")
    server.add_argument("--keys", action="store_true",
                        help="read operator keys on this terminal too (s/f END, t takeover, c coach, e e-stop)")
    server.add_argument("--backend", default="", help="package.module:make_backend: your own RobotBackend instead of "
                        "a LeRobot robot")
    limits = p.add_argument_group("limits (a LeRobot robot; they only tighten what its features and calibration give)")
    limits.add_argument("--control_hz", type=float, default=None, help="control rate (default: slowest camera fps, 30)")
    limits.add_argument("--image_size", type=int, nargs=2, metavar=("H", "W"), default=None,
                        help="resize every camera image to H x W before sending it")
    limits.add_argument("--low", nargs="+", default=[], metavar="NAME=V", help="lowest action values, by feature")
    limits.add_argument("--high", nargs="+", default=[], metavar="NAME=V", help="highest action values, by feature")
    limits.add_argument("--max_speed", nargs="+", default=[], metavar="V|NAME=V",
                        help="largest change per second (one number: every feature)")
    limits.add_argument("--home", nargs="+", default=[], metavar="NAME=V", help="where each reset moves the robot")
    limits.add_argument("--task", default="task", help="the task's name")
    limits.add_argument("--instruction", default="", help="the instruction the policy is given (default: --task)")
    limits.add_argument("--no-realtime", dest="realtime", action="store_false",
                        help="take actions as fast as they come (benchmarks), not one per control period")
    return p


def _named(items: Sequence[str], option: str) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ValueError(f"{option} {item!r}: expected NAME=NUMBER, e.g. shoulder_pan.pos=-90")
    return out


def limits_of(args: argparse.Namespace) -> LeRobotLimits:
    speed: float | dict[str, float] | None = None
    if len(args.max_speed) == 1 and "=" not in args.max_speed[0]:
        speed = float(args.max_speed[0])
    elif args.max_speed:
        speed = _named(args.max_speed, "--max_speed")
    return LeRobotLimits(control_hz=args.control_hz, image_size=tuple(args.image_size) if args.image_size else None,
                         low=_named(args.low, "--low"), high=_named(args.high, "--high"), max_speed=speed,
                         home=_named(args.home, "--home"), task=args.task, instruction=args.instruction,
                         realtime=args.realtime)


def lerobot_configs(args: Sequence[str]) -> tuple[Any, Any | None]:
    """(robot config, teleoperator config or None) from `--robot.*` / `--teleop.*` options, parsed as LeRobot's own
    commands parse them: its robots, teleoperators and cameras, third-party plugins (`lerobot_robot_*` packages)
    and `--robot.discover_packages_path=PACKAGE` loaded first."""
    try:
        import draccus
        from lerobot.configs import parser as lerobot_parser
        from lerobot.robots import RobotConfig
        from lerobot.teleoperators import TeleoperatorConfig
        from lerobot.utils.import_utils import register_third_party_plugins
    except ImportError as exc:
        raise ValueError(f"--robot.type needs LeRobot in this environment ({exc}): pip install lerobot, or serve "
                         "your own backend with --backend") from None
    for package in ("lerobot.robots", "lerobot.teleoperators", "lerobot.cameras"):  # their types, for the parser
        for module in pkgutil.iter_modules(importlib.import_module(package).__path__, package + "."):
            if module.ispkg:
                try:
                    importlib.import_module(module.name)
                except Exception:  # noqa: BLE001 - a device whose SDK is missing: its type is just not offered
                    pass
    register_third_party_plugins()
    args = list(args)
    for option, package in lerobot_parser.parse_plugin_args(lerobot_parser.PLUGIN_DISCOVERY_SUFFIX, args).items():
        lerobot_parser.load_plugin(package)
        args = lerobot_parser.filter_arg(option, args)

    # the types themselves, not this module's postponed annotations: draccus resolves them
    devices_class = make_dataclass("Devices", [("robot", RobotConfig),
                                               ("teleop", TeleoperatorConfig | None, field(default=None))])
    devices = draccus.parse(config_class=devices_class, args=args)
    return devices.robot, devices.teleop


def build(args: argparse.Namespace, lerobot_args: Sequence[str]) -> tuple[RobotBackend, OperatorSource | None]:
    """The backend (not yet connected) and the operator input near the robot."""
    limits = limits_of(args)
    if args.backend:
        if lerobot_args or limits != LeRobotLimits():
            raise ValueError("--backend serves your own backend, which sets its own limits: drop the --robot.*, "
                             "--teleop.* and limits options")
        backend = resolve(args.backend, "backend")()
        if not isinstance(backend, RobotBackend):
            raise ValueError(f"--backend {args.backend} made a {type(backend).__name__}, not a RobotBackend")
    elif not any(a.startswith("--robot.type") for a in lerobot_args):
        raise ValueError("name the robot: --robot.type=so101_follower --robot.port=... (LeRobot's options), "
                         "or --backend package.module:make_backend")
    else:
        robot_config, teleop_config = lerobot_configs(lerobot_args)
        backend = LeRobotBackend.from_configs(robot_config, teleop_config, limits)
    sources: list[OperatorSource] = []
    teleop = getattr(backend, "teleop", None)
    if teleop is not None and callable(getattr(teleop, "get_teleop_events", None)):
        sources.append(TeleopButtons(teleop))
    if args.keys:
        sources.append(KeyboardOperator(sys.stdin, echo=sys.stderr))
    return backend, (OperatorMix(sources) if len(sources) > 1 else sources[0] if sources else None)


def serve(backend: RobotBackend, operator: OperatorSource | None, args: argparse.Namespace) -> dict:
    """Connect `backend` (a robot that is not there or not calibrated stops the command here) and serve it until
    Ctrl-C, SIGTERM or `args.seconds`; the server's status and safety events at the end. The server closes the backend
    (from its robot thread) as it stops; before the server runs, this does."""
    try:
        connect = getattr(backend, "connect", None)
        if callable(connect):
            connect()
        server = RobotServer(backend, host=args.host, port=args.port, token=args.token, operator=operator,
                             heartbeat_timeout_s=args.heartbeat_timeout_s)
    except BaseException:
        backend.close()
        if operator is not None:
            operator.close()
        raise
    with server:
        host, port = server.address
        # SIGTERM stops it as Ctrl-C does, from before it says where it listens (a client can stop it at once)
        previous = _terminate_as_interrupt()
        try:
            print(f"robot side: {backend.name}, {len(backend.action_low)} action features at "
                  f"{backend.control_hz:g} Hz, cameras {list(backend.cameras)}; listening on {host}:{port}", flush=True)
            deadline = time.monotonic() + args.seconds if args.seconds > 0 else None
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        status = server.status()
    return {"address": [host, port], "events": server.events, "status": status}


def _terminate_as_interrupt() -> Any:
    """SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does (Python's default would end the process
    with the robot neither held nor closed); returns the handler it replaced (None off the main thread: left)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lerobot_args = [a for a in argv if a.startswith(LEROBOT_PREFIXES)]
    args = parser().parse_args([a for a in argv if not a.startswith(LEROBOT_PREFIXES)])
    try:
        backend, operator = build(args, lerobot_args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = serve(backend, operator, args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
