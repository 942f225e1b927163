"""Capsules from elsewhere at each trust level (`capsules.trust`), and a reader that stays in its bounds whatever
the bytes: each case here ran code, crashed, or passed its bound through the reader before these levels."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsule_rollout.capsules import (
    Arena,
    CapsuleMismatchError,
    add_safe_types,
    load_capsule,
    restore,
    save_capsule,
    snapshot,
)
from capsule_rollout.capsules import state_codec as sc
from capsule_rollout.capsules.graph.names import GraphNamespace
from capsule_rollout.capsules.state_codec import StateDecodeError, decode, encode
from capsule_rollout.envs.suites import make_env
from tests.capsules.any_name import AnyLoadedName

OTHER_KEY = "someone-else-s-key-0123456789abcdef"
COUNTER = "tests.envs.broken_envs:make_counter"


def _str(s: str) -> bytes:
    b = s.encode()
    return sc._varint(len(b)) + b


def _global(module: str, qualname: str) -> bytes:
    return bytes([sc.GLOBAL]) + _str(module) + _str(qualname)


def _evil_capsule(tmp_path, marker):
    """The counter env with an attribute the project's own writer saves: `close`, a bound method of a gymnasium
    `EnvSpec` whose entry point is `os:system` (calling it runs `touch marker`); saved signed with another key."""
    from gymnasium.envs.registration import EnvSpec

    env = make_env(COUNTER, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    spec = EnvSpec("Pwn-v0", entry_point="os:system", kwargs={"command": f"touch {marker}"},
                   disable_env_checker=True)
    env.unwrapped.close = spec.make
    path = save_capsule(snapshot(arena), tmp_path / "evil.capsule", key=OTHER_KEY)
    del env.unwrapped.close
    env.close()
    return path


def test_a_capsule_that_installs_a_method_runs_nothing_unless_trusted_as_code(tmp_path, report):
    marker = tmp_path / "pwned"
    path = _evil_capsule(tmp_path, marker)
    env = make_env(COUNTER, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    before = [t.numpy().tobytes() for t in snapshot(arena).tensors().values()]
    foreign = load_capsule(path, key=None)  # what `replay --trust` reads
    assert foreign.trust.value == "data"
    with pytest.raises(CapsuleMismatchError, match=r"EnvSpec at \.env\.close\.__self__.*--trust-code"):
        restore(arena, foreign)
    assert [t.numpy().tobytes() for t in snapshot(arena).tensors().values()] == before
    assert "close" not in vars(env.unwrapped)
    env.close()
    assert not marker.exists()
    # as code (`--trust-code`, as powerful as pickle): it restores, and the method is in place
    env = make_env(COUNTER, cameras=())
    arena = Arena([env]).allocate()
    restore(arena, load_capsule(path, key=None, trust="code"))
    installed = vars(env.unwrapped).get("close")
    assert installed is not None and installed.__func__.__qualname__ == "EnvSpec.make"
    del env.unwrapped.close  # not called: it would run the command
    env.close()
    assert not marker.exists()
    report.add("foreign capsule that installs a method (EnvSpec.make of os:system)", tried=2, refused_as_data=1,
               restored_as_code=1, commands_run=int(marker.exists()))


def test_a_capsule_that_puts_an_env_function_where_the_env_holds_another_is_refused_as_data(tmp_path):
    """A function the env's package holds, put where the env holds a different one: a name the allow-list
    accepts, at a place where it changes what the env calls."""
    env = make_env(COUNTER, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    env.unwrapped.observe = make_env  # a function of a package the env imports, set over the env's method
    path = save_capsule(snapshot(arena), tmp_path / "swap.capsule", key=OTHER_KEY)
    del env.unwrapped.observe
    with pytest.raises(CapsuleMismatchError, match=r"function .*make_env at \.env\.observe, where the env built "
                                                   r"here holds nothing"):
        restore(arena, load_capsule(path, key=None))
    assert "observe" not in vars(env.unwrapped)
    env.close()


class Record:
    """A plain record a test declares safe."""


def test_data_restores_the_env_bit_exactly_and_a_declared_class_may_be_made(tmp_path):
    env = make_env(COUNTER, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=2)
    for _ in range(5):
        env.step(np.array([0.3, -0.2], np.float32))
    env.unwrapped.note = Record()
    env.unwrapped.note.value = [1, 2.5, "x"]
    honest = snapshot(arena)
    path = save_capsule(honest, tmp_path / "c.capsule", key=OTHER_KEY)
    fresh = make_env(COUNTER, cameras=())
    fresh_arena = Arena([fresh]).allocate()
    with pytest.raises(CapsuleMismatchError, match=r"Record at \.env\.note"):
        restore(fresh_arena, load_capsule(path, key=None))
    add_safe_types(Record)
    restore(fresh_arena, load_capsule(path, key=None))
    assert fresh.unwrapped.note.value == [1, 2.5, "x"] and fresh.unwrapped.count == 5
    again = snapshot(fresh_arena)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(again.tensors().values(),
                                                                     honest.tensors().values()))
    fresh.step(np.array([0.1, 0.1], np.float32))
    env.step(np.array([0.1, 0.1], np.float32))
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(snapshot(fresh_arena).tensors().values(),
                                                                     snapshot(arena).tensors().values()))
    env.close()
    fresh.close()


# -- the reader's bounds, at every level ---------------------------------------------------------------------
def test_a_name_is_checked_where_the_object_lives():
    """`gymnasium.core:Any` is `typing.Any`: the allow-list admitted it as a name of the env's own package."""
    import gymnasium  # noqa: F401 - the env's package is loaded

    names = GraphNamespace(frozenset({"gymnasium.core:Env"}))
    stream = sc.MAGIC + bytes([sc.OBJECT]) + _global("gymnasium.core", "Any") + bytes([sc.NONE, sc.DICT, 0, sc.NONE])
    with pytest.raises(StateDecodeError, match="lives at typing:Any"):
        decode(stream, names)
    with pytest.raises(StateDecodeError, match="lives at typing:Any"):
        decode(sc.MAGIC + _global("gymnasium.core", "Any"), names)


@pytest.mark.parametrize("cls", ["numpy.random._pcg64:PCG64", "numpy.random._generator:Generator",
                                 "random:Random", "builtins:dict", "builtins:type"])
def test_no_extension_class_is_made_by_new_alone(cls):
    """A PCG64 made by `__new__` alone restored, and the next snapshot died of SIGSEGV."""
    module, qualname = cls.split(":")
    stream = sc.MAGIC + bytes([sc.OBJECT]) + _global(module, qualname) + bytes([sc.NONE, sc.DICT, 0, sc.NONE])
    with pytest.raises(StateDecodeError, match="never made from a capsule|never run"):
        decode(stream, AnyLoadedName())


def test_a_pcg64_made_by_new_no_longer_crashes_a_process(tmp_path):
    """In a child process: the stream read, the result used as numpy would: an error and exit 1, not a signal."""
    code = textwrap.dedent("""
        import sys
        import numpy.random  # loaded, as in any env that holds a generator
        from capsule_rollout.capsules import state_codec as sc
        s = lambda t: sc._varint(len(t.encode())) + t.encode()
        stream = sc.MAGIC + bytes([sc.OBJECT, sc.GLOBAL]) + s("numpy.random._pcg64") + s("PCG64") + bytes(
            [sc.NONE, sc.DICT, 0, sc.NONE])
        class Everything:
            def lookup(self, m, q, p):
                return sc.loaded(m, q)
        try:
            g = sc.decode(stream, Everything())
            print(g.state)  # what the next snapshot reads: SIGSEGV for one made by __new__ alone
        except sc.StateDecodeError as exc:
            print("refused:", exc)
            sys.exit(1)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.returncode, done.stderr[-500:])  # -11 before: SIGSEGV
    assert "refused: 'PCG64' is a built-in, extension or meta class" in done.stdout, done.stdout


def _peak(stream: bytes) -> tuple[int, bool]:
    tracemalloc.start()
    try:
        try:
            decode(stream, AnyLoadedName())
            refused = False
        except StateDecodeError:
            refused = True
        return tracemalloc.get_traced_memory()[1], refused
    finally:
        tracemalloc.stop()


def _copies(first: bytes, copy: bytes, n: int) -> bytes:
    """A list of `first` (memo index 1: the list itself is 0) then `n` items that each copy it."""
    return sc.MAGIC + bytes([sc.LIST]) + sc._varint(n + 1) + first + copy * n


FIELDS = bytes([sc.LIST]) + sc._varint(2000) + b"".join(
    bytes([sc.TUPLE, 2, sc.STR]) + _str(f"f{i}") + bytes([sc.STR]) + _str("<f8") for i in range(2000))


@pytest.mark.parametrize("kind, stream", [
    # np.dtype(spec) of a back reference to a list of 2,000 fields, 4,000 times
    ("dtype", _copies(FIELDS, bytes([sc.DTYPE, sc.MEMO, 1]), 4000)),
    # an XML element copying a back reference to a dict of 2,000 attributes
    ("element", _copies(bytes([sc.DICT]) + sc._varint(2000) + b"".join(
        bytes([sc.STR]) + _str(f"a{i}") + bytes([sc.STR]) + _str("v") for i in range(2000)),
        bytes([sc.ELEMENT, sc.STR]) + _str("t") + bytes([sc.MEMO, 1, sc.NONE, sc.NONE, sc.LIST, 0]), 4000)),
    # an array of Python objects whose shape claims 2**40 items
    ("object array", sc.MAGIC + bytes([sc.OBJECT_ARRAY, 1]) + sc._varint(1 << 40) + bytes([1, sc.LIST, 0])),
    ("object array 2**28", sc.MAGIC + bytes([sc.OBJECT_ARRAY, 1]) + sc._varint(1 << 28) + bytes([1, sc.LIST, 0])),
    ("no-byte items", sc.MAGIC + bytes([sc.ARRAY, sc.STR]) + _str("S0") + bytes([1]) + sc._varint(1 << 40)
     + bytes([1, 0])),
])
def test_copies_and_claimed_shapes_are_charged_before_they_are_made(kind, stream, report):
    """34 KB of state reached 675 MiB through copies of back references; 13 bytes claimed 256 MiB."""
    bound = sc.MEMORY_PER_BYTE * len(stream) + (1 << 20)
    peak, refused = _peak(stream)
    assert refused, kind
    assert peak < bound, (kind, peak, bound)
    report.peak("reader: copies and claimed shapes", **{f"peak_mib_{kind.replace(' ', '_')}": peak / 2**20},
                **{f"bound_mib_{kind.replace(' ', '_')}": bound / 2**20})


def test_nesting_through_back_references_is_bounded():
    """A chain of tuples, each holding the one before (2 bytes a level), hashed: 170,000 levels killed the
    process."""
    n = 5000
    items = bytes([sc.TUPLE, 0]) + b"".join(bytes([sc.TUPLE, 1, sc.MEMO]) + sc._varint(i + 1) for i in range(n))
    stream = sc.MAGIC + bytes([sc.LIST]) + sc._varint(n + 1) + items
    with pytest.raises(StateDecodeError, match="nested more than 200 deep \\(through back references\\)"):
        decode(stream, AnyLoadedName())
    ok = sc.MAGIC + bytes([sc.LIST]) + sc._varint(51) + items[: 2 + sum(len(bytes([sc.TUPLE, 1, sc.MEMO]) +
                                                                             sc._varint(i + 1)) for i in range(50))]
    assert len(decode(ok, AnyLoadedName())) == 51  # shallow sharing still reads


def test_keys_that_share_a_hash_are_refused():
    """20,000 integer keys sharing a hash took 5.1 s of CPU to decode (and again at every restore)."""
    p = (1 << 61) - 1
    keys = [i * p for i in range(1, 2001)]
    assert len({hash(k) for k in keys}) == 1
    with pytest.raises(StateDecodeError, match="share a hash"):
        decode(encode({k: 0 for k in keys}), AnyLoadedName())
    with pytest.raises(StateDecodeError, match="share a hash"):
        decode(encode(set(keys)), AnyLoadedName())
    assert len(decode(encode({i: 0 for i in range(5000)}), AnyLoadedName())) == 5000


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=4), inner,
                                                                                           max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(VALUES, st.data())
def test_any_damage_to_a_stream_is_the_reader_s_own_error(value, data):
    """A valid stream damaged (bytes changed, cut, inserted): it reads, or fails with `StateDecodeError`; nothing
    else escapes (an `AttributeError` did)."""
    stream = bytearray(encode([value, np.arange(3), {1: (2, 3)}, [b"x"] * 3]))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(len(sc.MAGIC), len(stream) - 1))
        how = data.draw(st.sampled_from(["set", "cut", "insert"]))
        byte = data.draw(st.integers(0, 255))
        if how == "set":
            stream[at] = byte
        elif how == "cut":
            del stream[at:]
            break
        else:
            stream.insert(at, byte)
    try:
        decode(bytes(stream), AnyLoadedName())
    except StateDecodeError:
        pass


def test_the_reader_s_error_for_anything_a_class_raises():
    class Boom:
        def __hash__(self):
            raise AttributeError("no")

    sys.modules[__name__].Boom = Boom
    Boom.__qualname__ = "Boom"
    stream = sc.MAGIC + bytes([sc.SET, 1, sc.OBJECT]) + _global(__name__, "Boom") + bytes(
        [sc.NONE, sc.DICT, 0, sc.NONE])
    with pytest.raises(StateDecodeError, match="AttributeError"):
        decode(stream, AnyLoadedName())


def test_an_actor_restores_a_saved_capsule_only_for_the_seed_it_was_signed_for(tmp_path):
    """Two validly signed initial capsules swapped on disk: the actor restored seed 2's state for seed 1."""
    from capsule_rollout.rollout.host_factory import RunSpec
    from capsule_rollout.rollout.rollout_actor import RolloutActor
    from capsule_rollout.rollout.rollout_host import capsule_key
    from capsule_rollout.rollout.run_capsules import capsule_path
    from tests.capsules.fakes import fill_state, make_arena

    arena, _ = make_arena()
    key = b"the-run-s-own-key-0123456789abcdef"
    paths = {}
    for seed in (1, 2):
        fill_state(arena, seed)
        paths[seed] = save_capsule(snapshot(arena, label=capsule_key("task", seed)),
                                   capsule_path(tmp_path, "task", seed), key=key)
    actor = RolloutActor.__new__(RolloutActor)  # the saved-capsule lookup alone: no host is built
    actor.spec, actor.capsule_key = RunSpec(capsule_dir=str(tmp_path)), key
    assert actor._saved_capsule("task", 1).meta.label == capsule_key("task", 1)
    one, two = paths[1].read_bytes(), paths[2].read_bytes()
    paths[1].write_bytes(two)
    paths[2].write_bytes(one)
    with pytest.warns(UserWarning, match="holds the initial capsule of 'task/s0000002', not of 'task/s0000001'"):
        assert actor._saved_capsule("task", 1) is None  # a cold reset instead


@pytest.mark.parametrize("env_id", ["tabletop:pick_place", "gymnasium:Reacher-v5", COUNTER,
                                    "tests.envs.broken_envs:make_rebuilds_at_reset"])
def test_an_env_restores_its_own_capsule_and_another_key_s_as_data_or_says_what_it_needs(env_id, tmp_path):
    """The survey of docs/BENCHMARKS.md (`tests/reliability/trust_survey.py`), for the envs of this venv: bit-exact
    from its own signed capsule, and from the same capsule signed elsewhere as data, or refused naming the class
    it would have to make."""
    from tests.reliability.trust_survey import survey

    row = survey(env_id, tmp_path)
    assert row["own"]["outcome"] == "bit-exact", row
    if env_id.endswith("make_rebuilds_at_reset"):  # it makes a new controller at every reset
        assert row["data"]["outcome"] == "refused" and "broken_envs:Controller at .env.controller" in \
            row["data"]["why"], row
    else:
        assert row["data"]["outcome"] == "bit-exact", row


def test_the_coverage_guided_fuzzer_runs_its_budget_with_nothing_but_the_reader_s_error(tmp_path):
    """`fuzz_state_reader` for a fixed budget of inputs (its long run's figures are in docs/BENCHMARKS.md): exit 0,
    every input read or refused, no allocation past the bound (any other outcome stops it with a crash report)."""
    pytest.importorskip("atheris")
    # no RSS limit here: a child of a large test process inherits its peak RSS (what libFuzzer reads); the bound
    # checked is the reader's own, per input
    done = subprocess.run([sys.executable, "-m", "tests.reliability.fuzz_state_reader", "-runs=4000",
                           "-max_len=4096", "-seed=1", "-rss_limit_mb=0", str(tmp_path / "corpus")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    last = [line for line in done.stderr.splitlines() if line.startswith("{")][-1]
    import json

    counts = json.loads(last)
    assert counts["inputs"] >= 4000 and counts["read"] + counts["refused"] == counts["inputs"], counts
    assert counts["worst_peak_share"] < 1.0


@pytest.mark.parametrize("make", [lambda: __import__("types").ModuleType("os"), lambda: __import__("ctypes").c_long,
                                  lambda: __import__("multiprocessing.connection").connection.Connection,
                                  lambda: __import__("copy").deepcopy, lambda: __import__("os").system])
def test_a_module_class_or_function_the_env_does_not_hold_there_is_refused_as_data(make, tmp_path):
    """Values the allow-list accepted by their names (a module named os, ctypes.c_long, a multiprocessing
    Connection, copy.deepcopy): as data they are refused wherever the env built here does not hold them."""
    env = make_env(COUNTER, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    try:
        env.unwrapped.helper = make()
        capsule = snapshot(arena)
    except Exception as exc:  # noqa: BLE001 - the writer refused it: nothing to restore
        assert "cannot" in str(exc) or "refused" in str(exc), exc
        return
    finally:
        vars(env.unwrapped).pop("helper", None)
    path = save_capsule(capsule, tmp_path / "c.capsule", key=OTHER_KEY)
    with pytest.raises(CapsuleMismatchError, match=r"at \.env\.helper, where the env built here holds nothing"):
        restore(arena, load_capsule(path, key=None))
    assert "helper" not in vars(env.unwrapped)
    env.close()
