"""Operator input: key parsing, a keyboard read from a pipe, the scripted operator."""

import os
import time

from capsule_rollout.robot_side.operator_input import KeyboardOperator, KeyParser, Kind, OperatorEvent, ScriptedOperator


def test_keys_become_events_with_takeover_toggling_and_coaching():
    p = KeyParser()
    assert [e.kind for e in p.feed("t")] == [Kind.TAKEOVER_ON]
    assert [e.kind for e in p.feed("xT")] == [Kind.TAKEOVER_OFF]  # unknown keys are ignored
    events = p.feed("cpick the blu\x7fue block\nS")
    assert events == [OperatorEvent(Kind.COACH, "pick the blue block"), OperatorEvent(Kind.END_SUCCESS)]
    assert p.feed("c\x1bf") == [OperatorEvent(Kind.END_FAILURE)]  # Esc cancels coaching
    assert p.feed("c  \n") == []  # empty coaching is dropped
    assert p.feed("e") == [OperatorEvent(Kind.ESTOP)]
    assert p.feed("cs") == [] and p.feed("top\n") == [OperatorEvent(Kind.COACH, "stop")]  # 's' inside text is text
    assert p.feed("?") == [] and p.help_requested


def test_keyboard_operator_reads_a_stream_without_blocking():
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb", buffering=0) as stream:
        op = KeyboardOperator(stream)
        op.begin_episode()
        assert op.poll(0) == []  # nothing typed: returns at once
        os.write(write_fd, b"tcgo left\n")
        deadline = time.monotonic() + 5
        events = []
        while len(events) < 2 and time.monotonic() < deadline:
            events += op.poll(1)
            time.sleep(0.01)
        assert events == [OperatorEvent(Kind.TAKEOVER_ON), OperatorEvent(Kind.COACH, "go left")]
        os.write(write_fd, b"s")
        os.close(write_fd)
        deadline = time.monotonic() + 5
        while not (got := op.poll(2)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [OperatorEvent(Kind.END_SUCCESS)]
        op.close()


def test_keyboard_operator_in_a_pseudo_terminal_acts_on_single_keys_and_restores_the_terminal():
    import io
    import pty
    import termios

    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    assert before[3] & termios.ICANON  # a fresh terminal is line-buffered
    echo = io.StringIO()
    with os.fdopen(slave, "rb", buffering=0, closefd=False) as tty_in:
        op = KeyboardOperator(tty_in, echo=echo)
        assert not termios.tcgetattr(slave)[3] & termios.ICANON  # cbreak: keys act without Enter
        op.begin_episode()
        os.write(master, b"t?")
        deadline = time.monotonic() + 5
        while not (got := op.poll(0)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [OperatorEvent(Kind.TAKEOVER_ON)]
        deadline = time.monotonic() + 5
        while echo.getvalue().count("s: END success") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert echo.getvalue().count("s: END success") == 2  # at start, and again for "?"
        op.close()
    assert termios.tcgetattr(slave) == before  # restored as it was
    os.close(master)
    os.close(slave)


def test_keys_pressed_before_the_first_episode_starts_are_never_acted_on():
    """The race real_recap had: keys were read (and acted on) while the policy loaded, before any episode. Now
    the keyboard reads from the first episode's start; what was typed ahead is dropped, and the keys are shown
    then."""
    import io
    import pty

    from capsule_rollout.rollout.handoff import SubtaskChannel
    from capsule_rollout.rollout.operator_control import OperatorControl

    master, slave = pty.openpty()
    echo = io.StringIO()
    with os.fdopen(slave, "rb", buffering=0, closefd=False) as tty_in:
        op = KeyboardOperator(tty_in, echo=echo)
        os.write(master, b"tcgo left\n")  # while the policy loads
        time.sleep(0.3)
        assert op.poll(0) == [] and echo.getvalue() == ""  # nothing read, nothing shown
        control = OperatorControl(op, None, SubtaskChannel(), lambda success: None)
        control.start_episode()  # what the host does when an episode starts: the keyboard starts reading
        assert "s: END success" in echo.getvalue()
        os.write(master, b"s")
        deadline = time.monotonic() + 5
        while not (got := op.poll(1)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [OperatorEvent(Kind.END_SUCCESS)]  # the typed-ahead takeover and coaching were dropped
        op.close()
    os.close(master)
    os.close(slave)


def test_scripted_operator_plays_each_event_once_and_catches_up():
    op = ScriptedOperator({3: OperatorEvent(Kind.TAKEOVER_ON), 5: [OperatorEvent(Kind.TAKEOVER_OFF),
                                                                    OperatorEvent(Kind.END_FAILURE)]})
    assert op.poll(0) == [] and op.poll(3) == [OperatorEvent(Kind.TAKEOVER_ON)] and op.poll(3) == []
    assert [e.kind for e in op.poll(9)] == [Kind.TAKEOVER_OFF, Kind.END_FAILURE]  # step 5 passed: delivered now
    op.reset()
    assert len(op.poll(10)) == 3
