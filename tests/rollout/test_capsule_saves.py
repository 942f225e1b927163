"""The seeds' initial capsules are signed and saved on the actor's saver thread, off the play's path, and every one
is on disk before the call's reports go back; a save that fails fails the call."""

import dataclasses
import threading

import pytest

from capsule_rollout.rollout import rollout_actor
from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.rollout_actor import RolloutActor, WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.rollout.run_capsules import capsule_path
from tests.policies.tiny import save_tiny_checkpoints


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    policy, critic = save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))
    return RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, host=HostConfig(n_exec=2, max_steps=4))


def test_the_capsules_are_saved_off_the_play_thread_and_on_disk_when_the_call_returns(spec, tmp_path, monkeypatch):
    spec = dataclasses.replace(spec, capsule_dir=str(tmp_path / "capsules"))
    threads, real = [], rollout_actor.save_initial_capsule

    def slow_save(*args, **kwargs):
        threads.append(threading.current_thread().name)
        threading.Event().wait(0.2)  # a slow disk: the call still returns only once the file is there
        return real(*args, **kwargs)

    monkeypatch.setattr(rollout_actor, "save_initial_capsule", slow_save)
    actor = RolloutActor(spec)
    try:
        reports = actor.run_batch([WorkItem(f"e{s}", s) for s in (3, 4)])
        assert all(r.episode is not None for r in reports)
        assert all(capsule_path(spec.capsule_dir, "pick_place", s).is_file() for s in (3, 4))
        assert threads and all(name.startswith("capsule-save") for name in threads), threads
        assert reports[0].part_s["capsule_save"] >= 0.2  # the call waited for the slow disk, and says so
    finally:
        actor.close()


def test_a_save_that_fails_fails_the_call(spec, tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rollout_actor, "save_initial_capsule", full_disk)
    actor = RolloutActor(dataclasses.replace(spec, capsule_dir=str(tmp_path / "capsules")))
    try:
        with pytest.raises(OSError, match="No space left"):
            actor.run_batch([WorkItem("e5", 5)])
    finally:
        monkeypatch.undo()
        actor.close()
