"""The robot bridge cannot be squatted on loopback with a token server: eight silent connections reopened
whenever one is dropped, or a flood of them past the pending pool, and the rightful client is served 10 of
10 times; wrong tokens from one peer address are answered ever slower (each at least the documented
backoff after the one before), however many connections it opens, while another address is served.

No timing is asserted beyond lower bounds the server guarantees (a refusal never comes before its
backoff); how many answers a peer got per second goes to the report.
"""

from __future__ import annotations

import math
import threading
import time

from tests.reliability.bridge_fuzz import CLIENT_TIMEOUT_S, health_check
from tests.reliability.bridge_squat import TOKEN, Squatters, most_checks, silent_connections, squat_server, wrong_token

BACKOFF_S, BACKOFF_MAX_S = 0.1, 0.4  # the tests' server: quick to reach the cap


def _delay(n: int) -> float:
    """The documented wait before the n-th wrong token in a row from one address is answered."""
    return min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (n - 1))


def _serve_ten(server) -> tuple[int, float]:
    """Ten attempts of the rightful client, 0.3 s apart: (how many were served, the longest wait for welcome)."""
    served, waits = 0, []
    for _ in range(10):
        ok, waited = health_check(server, token=TOKEN)
        served += ok
        waits.append(waited)
        time.sleep(0.3)
    return served, max(waits)


def test_eight_squatters_reopened_whenever_dropped_do_not_lock_the_rightful_client_out(report):
    with squat_server() as server, Squatters(server.address, 8) as squatters:
        deadline = time.monotonic() + 10
        while squatters.opened < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        served, wait = _serve_ten(server)  # about 3.5 s: every squatter is dropped (and back) at least once
        opened = squatters.opened
    report.add("bridge squatting", rightful_attempts=10, rightful_served=served, squatter_connections=opened)
    report.peak("bridge squatting", max_wait_of_the_rightful_client_s=wait)
    assert served == 10
    assert opened > 8  # the squatters were dropped and came back meanwhile
    assert wait < CLIENT_TIMEOUT_S


def test_a_flood_of_silent_connections_stays_in_its_pool_and_the_rightful_client_is_served(report):
    with squat_server(max_pending=8) as server:
        flood = silent_connections(server.address, 24)
        try:
            served, wait = _serve_ten(server)
            status = server.status()
        finally:
            for sock in flood:
                sock.close()
    report.add("bridge pending flood", rightful_attempts=10, rightful_served=served, flood_connections=len(flood),
               flood_evicted=status["evicted"])
    assert served == 10
    assert status["pending"] <= 8 and status["connections"] <= 1  # the flood holds at most its pool
    assert status["evicted"] >= len(flood) - 8


def test_wrong_tokens_from_one_peer_are_answered_ever_slower(report):
    with squat_server(auth_backoff_s=BACKOFF_S, auth_backoff_max_s=BACKOFF_MAX_S) as server:
        answers = []
        start = time.monotonic()
        while time.monotonic() - start < 2.0:  # one connection after another, as fast as the answers come
            answers.append(wrong_token(server.address))
        elapsed = time.monotonic() - start
    report.add("bridge brute force", wrong_tokens_sent_one_after_another=len(answers))
    report.peak("bridge brute force", wrong_token_answers_per_s_one_peer=round(len(answers) / elapsed, 1))
    assert {code for _, code in answers} == {"unauthorized:checked"}
    for n, (waited, _) in enumerate(answers, 1):  # the n-th refusal never comes before its backoff
        assert waited >= _delay(n), (n, waited, _delay(n))
    assert len(answers) <= most_checks(elapsed, _delay)


def test_a_brute_force_over_many_connections_is_checked_no_faster_while_another_peer_is_served(report):
    with squat_server(auth_backoff_s=BACKOFF_S, auth_backoff_max_s=BACKOFF_MAX_S) as server:
        stop, answers, lock = threading.Event(), [], threading.Lock()

        def attacker() -> None:
            while not stop.is_set():
                answer = wrong_token(server.address)
                with lock:
                    answers.append(answer)

        threads = [threading.Thread(target=attacker) for _ in range(6)]
        start = time.monotonic()
        for t in threads:
            t.start()
        try:
            served, wait = _serve_ten(server)  # from 127.0.0.1 while 127.0.0.2 guesses on six connections
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        elapsed = time.monotonic() - start
    checked = sum(code == "unauthorized:checked" for _, code in answers)
    report.add("bridge brute force", rightful_attempts=10, rightful_served=served,
               wrong_tokens_sent_in_parallel=len(answers), wrong_tokens_checked_in_parallel=checked)
    report.peak("bridge brute force", wrong_tokens_checked_per_s_six_connections=round(checked / elapsed, 1),
                max_wait_of_another_peer_s=wait)
    assert served == 10 and wait < CLIENT_TIMEOUT_S
    assert checked <= most_checks(elapsed, _delay)  # parallel connections check no more tokens than one
    assert all(code.startswith("unauthorized") or code == "busy" or math.isnan(w) for w, code in answers)
