"""`capsules.signing_key`: the key capsules are signed with, from the environment, a named file, or a default
file made once, readable by its owner only."""

from __future__ import annotations

import multiprocessing
import stat

import pytest

from capsule_rollout.capsules.signing_key import KEY_ENV, KEY_FILE_ENV, SigningKeyError, default_key_path, signing_key


@pytest.fixture
def no_key(monkeypatch, tmp_path):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def test_the_default_file_is_made_once_for_its_owner_only(no_key):
    assert not default_key_path().exists()
    key = signing_key()
    path = default_key_path()
    assert path == no_key / "config" / "capsule_rollout" / "capsule.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) == 64
    assert signing_key() == key  # made once
    assert not list(path.parent.glob(".*"))  # no temporary file left


def test_the_environment_and_a_named_file_come_first(no_key, monkeypatch):
    named = no_key / "team.key"
    named.write_text("a-key-the-team-shares-0123456789\n")
    monkeypatch.setenv(KEY_FILE_ENV, str(named))
    assert signing_key() == b"a-key-the-team-shares-0123456789"
    monkeypatch.setenv(KEY_ENV, "from-the-environment-0123456789")
    assert signing_key() == b"from-the-environment-0123456789"
    assert not default_key_path().exists()


@pytest.mark.parametrize(("setup", "message"), [
    (lambda d, mp: mp.setenv(KEY_ENV, "short"), "has 5 bytes; a key needs 16"),
    (lambda d, mp: mp.setenv(KEY_FILE_ENV, str(d / "missing.key")), "does not exist"),
    (lambda d, mp: (d.joinpath("empty.key").write_text(""), mp.setenv(KEY_FILE_ENV, str(d / "empty.key"))),
     "has 0 bytes"),
])
def test_a_key_that_cannot_be_used_says_what_to_fix(no_key, monkeypatch, setup, message):
    setup(no_key, monkeypatch)
    with pytest.raises(SigningKeyError, match=message):
        signing_key()


def _key(queue):
    queue.put(signing_key())


def test_processes_making_the_default_key_at_once_agree(no_key):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_key, args=(queue,)) for _ in range(4)]
    for p in procs:
        p.start()
    keys = {queue.get(timeout=60) for _ in procs}
    for p in procs:
        p.join()
    assert len(keys) == 1 and keys == {signing_key()}
