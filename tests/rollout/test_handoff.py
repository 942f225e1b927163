"""Subtask hand-off: round trip, zero copies, no torn reads under stress (threads and processes)."""

import copy
import multiprocessing as mp
import pickle
import sys
import threading
import time

import numpy as np
import pytest

from capsule_rollout.rollout.handoff import NBYTES, TEXT_BYTES, HandoffError, SubtaskChannel


def _text(i: int) -> str:
    # self-checking payload: the index, then a length that depends on it
    return f"{i}:" + "abcdefghij"[i % 10] * (i % 200)


def _consistent(sub) -> bool:
    head, _, body = sub.text.partition(":")
    return int(head) == sub.index and len(body) == sub.index % 200 and set(body) <= {"abcdefghij"[sub.index % 10]}


def test_publish_read_poll_and_coach():
    ch = SubtaskChannel()
    first = ch.read()
    assert first.version == 0 and first.source == "none" and first.text == ""
    assert ch.publish("pick up the red block", 0) == 1
    sub = ch.read()
    assert (sub.version, sub.index, sub.text, sub.source) == (1, 0, "pick up the red block", "planner")
    assert ch.poll(1) is None and ch.poll(0) == sub
    assert ch.coach("no, the blue one") == 2
    assert ch.read().text == "no, the blue one" and ch.read().source == "coach" and ch.read().index == -1
    ch.publish("é" * (TEXT_BYTES // 2), 3)  # multi-byte text up to the limit
    assert ch.read().text == "é" * (TEXT_BYTES // 2)


def test_bad_subtasks_are_refused_and_leave_the_current_one():
    ch = SubtaskChannel()
    ch.publish("place it on the pad", 1)
    with pytest.raises(ValueError, match="non-empty"):
        ch.publish("   ")
    with pytest.raises(ValueError, match="at most 256"):
        ch.publish("x" * (TEXT_BYTES + 1))
    with pytest.raises(ValueError, match="source"):
        ch.publish("ok", source=7)
    assert ch.read().text == "place it on the pad" and ch.version() == 1
    with pytest.raises(TypeError, match="create_shared"):
        pickle.dumps(ch)
    with pytest.raises(HandoffError, match="no subtask channel"):
        SubtaskChannel.attach("rollout-handoff-does-not-exist")


def test_writer_and_reader_share_memory():
    ch = SubtaskChannel()
    # the tensor the actor would hold and the array the planner writes are one block
    assert ch.tensor.numpy().__array_interface__["data"][0] == ch.address
    ch.publish("stack the green block", 2)
    assert bytes(ch.tensor[32:32 + 21].numpy()) == b"stack the green block"
    with SubtaskChannel.create_shared() as shared:
        other = SubtaskChannel.attach(shared.name)  # a second mapping of the same segment
        shared.publish("push the blue block", 4)
        assert other.read().text == "push the blue block"  # visible with no message sent
        assert len(pickle.dumps(shared)) < 200  # a handle crosses processes, never the payload
        again = copy.copy(shared)  # rebuilt through the same __reduce__ a process boundary uses: re-attach by name
        again.coach("stop")
        assert shared.read().text == "stop"
        other.close()
        again.close()


def test_a_writer_that_died_mid_write_is_detected_and_overwritten():
    ch = SubtaskChannel()
    ch.publish("first", 0)
    ch._words[0] += 1  # what a writer killed between its two counter stores leaves
    with pytest.raises(HandoffError, match="mid-write"):
        ch.read(timeout_s=0.05)
    assert ch.publish("second", 1) == 3  # the dead write used up version 2
    assert ch.read().text == "second"


def test_a_reader_waits_for_a_write_in_progress():
    ch = SubtaskChannel()
    ch.publish("old", 0)
    ch._words[0] += 1  # a writer is mid-write ...
    ch._text[:3] = np.frombuffer(b"new", np.uint8)  # ... and has written part of the payload
    got = []
    reader = threading.Thread(target=lambda: got.append(ch.read(timeout_s=5.0)))
    reader.start()
    time.sleep(0.05)
    assert not got  # still waiting: the half-written payload was not returned
    ch._words[1] = 1  # the writer finishes
    ch._words[0] += 1
    reader.join(5)
    assert got and (got[0].text, got[0].index, got[0].version) == ("new", 1, 2)


def test_no_torn_reads_between_threads():
    ch = SubtaskChannel()
    ch.publish(_text(0), 0)
    n_writes = 20000
    seen, bad = set(), []

    def writer():
        for i in range(1, n_writes + 1):
            ch.publish(_text(i), i)
            if i % 16 == 0:
                time.sleep(0)  # let the reader in now and then

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        t = threading.Thread(target=writer)
        t.start()
        while t.is_alive():
            time.sleep(0)
            sub = ch.read()
            seen.add(sub.version)
            if not _consistent(sub):
                bad.append(sub)
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert not bad, bad[:3]
    assert len(seen) > 50  # the reader really ran during the writes
    assert ch.read().version == n_writes + 1


def _write_until(name: str, ready, stop) -> None:
    ch = SubtaskChannel.attach(name)
    ready.set()
    i = 0
    while not stop.is_set():
        i += 1
        ch.publish(_text(i), i)
    ch.close()


def test_no_torn_reads_across_processes():
    with SubtaskChannel.create_shared() as ch:
        ch.publish(_text(0), 0)
        ctx = mp.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_write_until, args=(ch.name, ready, stop))
        proc.start()
        try:
            assert ready.wait(60)
            seen, bad, mid_write, reads = set(), [], 0, 0
            deadline = time.monotonic() + 60
            # read until the race was really exercised (adapts to a loaded machine)
            while (len(seen) < 500 or mid_write < 5) and time.monotonic() < deadline and proc.is_alive():
                mid_write += int(ch._words[0]) & 1
                sub = ch.read()
                reads += 1
                seen.add(sub.version)
                if not _consistent(sub):
                    bad.append(sub)
        finally:
            stop.set()
            proc.join(30)
        assert proc.exitcode == 0
        assert not bad, bad[:3]
        assert len(seen) >= 500, f"only {len(seen)} versions seen in {reads} reads"
        assert mid_write >= 5  # the reader caught the writer mid-write: the retry path ran
        last = ch.read()
        assert _consistent(last) and ch.version() == last.version
        assert np.frombuffer(ch.tensor.numpy()[:8].tobytes(), np.int64)[0] == 2 * last.version
        assert NBYTES == 32 + TEXT_BYTES
