"""The robot bridge under fuzzing, on loopback: bursts of broken, hostile and valid sessions (four at
once, another client probing in the middle), then two sessions of extreme actions, against a live sim
robot server whose actuators are checked, a health check after each burst; then a slow-dripping
controller, a silent connection and clients racing for the robot.

Nothing may crash the server, no bad action may reach the robot, and another client always gets an
answer within its own timeout. Bounded: 6 bursts of 8 sessions by default, 40 under `slow`, each
session at most 10 s.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from capsule_rollout.envs.robot_bridge import RobotClient, RobotError
from capsule_rollout.robot_side.protocol import Message, encode
from tests.reliability.bridge_fuzz import (
    CLIENT_TIMEOUT_S,
    actuator_session,
    checked_server,
    health_check,
    run_session,
    session,
    time_to_first_reply,
)

SESSIONS_PER_BURST = 8


@pytest.fixture(scope="module")
def server():
    with checked_server(heartbeat_timeout_s=0.5) as srv:
        yield srv


def _handler_errors(server) -> list[str]:
    return [e for e in server.events if e.startswith("handler failed")]


def _fuzz(server, report, bursts: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    frames, crashes, waits = 0, 0, []
    with ThreadPoolExecutor(4) as pool:  # four sessions at a time: one controls the robot, others are told busy
        for _ in range(bursts):
            running = [pool.submit(run_session, server.address, session(rng)) for _ in range(SESSIONS_PER_BURST)]
            time.sleep(0.05)
            waits.append(time_to_first_reply(server.address)[0])  # another client, in the middle of the burst
            frames += sum(f.result() for f in running)
            frames += sum(run_session(server.address, actuator_session(rng)) for _ in range(2))
            ok, waited = health_check(server)
            crashes += not ok
            waits.append(waited)
    backend = server.backend
    report.add("bridge fuzz", frames_sent=frames, bursts=bursts, server_crashes=crashes,
               bad_actions_reaching_the_robot=len(backend.bad), handler_errors=len(_handler_errors(server)),
               actions_applied=backend.applied)
    report.peak("bridge", max_wait_of_another_client_s=max(waits))
    assert crashes == 0 and server.alive
    assert not backend.bad, backend.bad[:5]
    assert not _handler_errors(server), _handler_errors(server)[:5]
    assert backend.applied > bursts  # valid actions did get through
    assert max(waits) < CLIENT_TIMEOUT_S


def test_fuzzed_sessions_never_crash_the_server_nor_reach_the_robot(server, report):
    _fuzz(server, report, bursts=6, seed=1)


@pytest.mark.slow
def test_many_fuzzed_sessions(server, report):
    _fuzz(server, report, bursts=40, seed=2)


def test_a_slow_drip_a_silent_connection_and_racing_clients(server, report):
    waits = []
    # a controller that drips a frame one byte per 0.1 s: the robot is held; a client arriving meanwhile waits for
    # that frame, and gets the robot once the dripper is dropped (2 s after the frame's first byte)
    dripper = socket.create_connection(server.address, timeout=5)
    dripper.sendall(encode(Message("hello", {"token": ""})) + encode(Message("reset", {"seed": 4}, seq=1)))
    time.sleep(0.3)
    frame = encode(Message("action", {}, {"action": np.ones(4, np.float32)}, seq=2))
    for byte in frame[:15]:
        dripper.send(bytes([byte]))
        time.sleep(0.1)
    assert server.episode_state == "aborted" and server.backend.held  # 1.5 s with no whole frame
    waited_for_drip, answer = time_to_first_reply(server.address)
    assert answer == "welcome" and waited_for_drip < CLIENT_TIMEOUT_S
    dripper.shutdown(socket.SHUT_WR)  # leave as RobotClient.close does: the server has let go once it closes
    while dripper.recv(65536):
        pass
    dripper.close()
    # a silent connection: a proper client is served meanwhile
    silent = socket.create_connection(server.address, timeout=5)
    waited_for_drip, answer = time_to_first_reply(server.address)
    assert answer == "welcome" and waited_for_drip < CLIENT_TIMEOUT_S
    silent.close()
    # six clients racing for the robot: each retries on busy until it has done ten actions
    done, lock = [], threading.Lock()

    def racer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            start = time.monotonic()
            try:
                client = RobotClient(*server.address, timeout_s=CLIENT_TIMEOUT_S)
            except RobotError as exc:
                with lock:
                    waits.append(time.monotonic() - start)
                assert exc.code == "busy"
                time.sleep(rng.uniform(0.01, 0.1))
                continue
            with lock:
                waits.append(time.monotonic() - start)
            with client:
                client.reset_to_initial(seed=seed)
                for _ in range(10):
                    client.send_action(rng.uniform(-1, 1, 4).astype(np.float32))
            with lock:
                done.append(seed)
            return

    threads = [threading.Thread(target=racer, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    report.add("bridge special cases", frames_sent=len(frame) + 3 + len(waits))
    report.peak("bridge", max_wait_of_another_client_s=max(waits))
    report.peak("bridge special cases", wait_for_the_dripping_controller_to_be_dropped_s=waited_for_drip)
    assert sorted(done) == list(range(6))  # every racer got the robot in turn
    assert max(waits) < CLIENT_TIMEOUT_S
    assert not server.backend.bad and server.alive
