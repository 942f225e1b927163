"""The graph capture's Python state (`capsules.graph.state`, `envs.object_graph`): a crafted capsule runs no code
and reaches no memory outside what it names, and a refused one leaves the env as it was."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Arena, Capsule, CapsuleMismatchError, load_capsule, restore, save_capsule, snapshot
from capsule_rollout.capsules import state_codec as sc
from capsule_rollout.envs.object_graph import GraphState, GraphStateError
from capsule_rollout.envs.object_graph import split as _split
from capsule_rollout.envs.suites import make_env
from tests.envs.broken_envs import KeepsACounter, make_counter


class HoldsAView(KeepsACounter):
    """Keeps a view of MjData's puck position (an alias a capsule re-links, as dm_control's `_warnings`)."""

    def __init__(self):
        super().__init__()
        self.puck = self.data.qpos[7:9]


def make_view_holder():
    return HoldsAView()


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _text(x: str) -> bytes:
    return b"X" + len(x.encode()).to_bytes(4, "little") + x.encode()


def _call(f: bytes, *args: bytes) -> bytes:
    return f + b"(" + b"".join(args) + b"tR"  # MARK args TUPLE REDUCE: f(*args) when unpickled


def _states(call: bytes) -> bytes:
    """A pickle of `([<call>], None)`, the shape the states part had."""
    return b"\x80\x03(" + call + b"lN\x86."


def exploits(marker) -> dict[str, bytes]:
    """Pickle streams that run `touch marker` when unpickled, the ways a crafted capsule ran a command before
    this format: `getattr` from an allowed builtin to `__import__('os').system`, torch's storage loader
    unpickling a nested stream (it loads without `weights_only`), and a plain reduce."""
    cmd = _text(f"touch {marker}")
    getattr_ = _global("builtins", "getattr")
    builtins = _call(getattr_, getattr_, _text("__self__"))
    os_module = _call(_call(getattr_, builtins, _text("__import__")), _text("os"))
    via_getattr = _call(_call(getattr_, os_module, _text("system")), cmd)
    nested = b"\x80\x02" + _call(_global("os", "system"), cmd) + b"."
    via_torch = _call(_global("torch.storage", "_load_from_bytes"), b"B" + len(nested).to_bytes(4, "little") + nested)
    return {"getattr": _states(via_getattr), "torch storage": _states(via_torch),
            "plain reduce": _states(_call(_global("os", "system"), cmd))}


def _with_part(blob: bytes, index: int, part: bytes) -> bytes:
    parts = _split(blob)
    parts[index] = part
    return b"".join(len(p).to_bytes(8, "little") + p for p in parts)


@pytest.fixture
def counter():
    env = make_counter()
    env.reset(seed=0)
    for _ in range(3):
        env.step(env.action_space.sample())
    return env


def test_a_pickle_that_runs_a_command_is_refused_and_nothing_runs(counter, tmp_path):
    graph = GraphState(counter)
    blob = graph.snapshot()
    for name, payload in exploits(tmp_path / "pwned").items():
        for index in (0, 1, 2):  # the plan, the view bases, the states: none is read as pickle
            with pytest.raises(GraphStateError, match="not Python state in this project's format"):
                graph.restore(_with_part(blob, index, payload))
            assert not (tmp_path / "pwned").exists(), name


def test_names_the_env_does_not_hold_are_refused(counter):
    graph = GraphState(counter)
    blob = graph.snapshot()
    states = sc.decode(_split(blob)[2], graph._namespace(), persistent=lambda pid: pid)
    for value, refused in ((__import__("os").system, "names posix:system"),
                           (getattr, "names builtins:getattr"),
                           (pickle.loads, "names _pickle:loads")):
        forged = sc.encode((states[0][:-1] + [value], states[1]))  # a generator's state swapped for the name
        with pytest.raises(GraphStateError, match=refused):
            graph.restore(_with_part(blob, 2, forged))


def _plan(graph: GraphState, blob: bytes) -> list:
    return list(sc.decode(_split(blob)[0], graph._namespace()))


def test_an_alias_or_view_past_its_memory_is_refused(tmp_path):
    env = make_env(f"{__name__}:make_view_holder", cameras=())
    env.reset(seed=0)
    graph = env._graph
    blob = graph.snapshot()
    plan = _plan(graph, blob)
    (h, field, offset, shape, strides, dtype), = plan[3]  # the puck's view of MjData.qpos
    assert field == "qpos"
    for moved, refused in ((offset + (1 << 30), "a view of bytes 1073741880..1073741896"),
                           (-(1 << 20), "a view of bytes -1048576")):
        forged = [*plan[:3], [(h, field, moved, shape, strides, dtype)], *plan[4:]]
        with pytest.raises(GraphStateError, match=refused):
            graph.restore(_with_part(blob, 0, sc.encode(tuple(forged))))
    forged = [*plan[:3], [(h, "__class__", 0, shape, strides, dtype)], *plan[4:]]
    with pytest.raises(GraphStateError, match="no array of a MjData"):
        graph.restore(_with_part(blob, 0, sc.encode(tuple(forged))))
    graph.restore(blob)
    assert np.shares_memory(env.unwrapped.puck, env.unwrapped.data.qpos)  # the honest alias re-linked
    bases = [np.zeros(4)]
    for view, refused in (((0, 8, (4,), (8,), "<f8", True), "a view of bytes 8..40"),
                          ((0, 0, (2,), (-8,), "<f8", True), "a view of bytes -8..8"),
                          ((0, 0, (1,), (8,), "O", True), "Python objects"),
                          ((3, 0, (1,), (8,), "<f8", True), "base 3")):
        forged = [*plan[:4], [view], *plan[5:]]
        with pytest.raises(GraphStateError, match=refused):
            graph.restore(_with_part(_with_part(blob, 1, sc.encode(bases)), 0, sc.encode(tuple(forged))))
    env.close()


def test_a_malformed_plan_or_generator_state_is_refused_before_anything_changes(counter):
    graph = GraphState(counter)
    blob = graph.snapshot()
    plan = _plan(graph, blob)
    before = graph.dump()
    for forged in (
        (plan[0], plan[1]),  # too short
        ([(("a", 3),), "X", "handle"], *plan[1:]),  # a path step of the wrong type
        (plan[0], plan[1], [((), int)], *plan[3:]),  # a "generator" of another type
    ):
        with pytest.raises(GraphStateError, match="malformed"):
            graph.restore(_with_part(blob, 0, sc.encode(tuple(forged))))
    states, glob = sc.decode(_split(blob)[2], graph._namespace(), persistent=lambda pid: pid)
    bad = sc.encode((states, ({"bit_generator": "MT19937", "state": {"key": [1], "pos": 5}}, glob[1])))
    with pytest.raises(GraphStateError, match="generator state"):
        graph.prepare(_with_part(blob, 2, bad))
    counter.step(counter.action_space.sample())
    assert graph.dump() != before  # the env moved on, so an unchanged dump below means nothing was restored
    moved = graph.dump()
    with pytest.raises(GraphStateError):
        graph.restore(_with_part(blob, 2, bad))
    assert graph.dump() == moved


def test_a_generator_state_numpy_takes_but_whose_position_lies_past_its_buffer_is_refused(counter):
    """numpy sets an MT19937 `pos` or a Philox `buffer_pos` as given, and its next draw then reads the state's array
    at that position (past the 624-word key: a crash, or memory read as randomness). A capsule holding one is refused
    before anything changes, whether the state is the global `numpy.random`'s or a generator's of the env."""
    counter.philox = np.random.Generator(np.random.Philox(0))
    graph = GraphState(counter)
    blob = graph.snapshot()
    states, glob = sc.decode(_split(blob)[2], graph._namespace(), persistent=lambda pid: pid)
    plan = _plan(graph, blob)
    n = len(plan[1])  # the plan: refs, objects, generators...
    philox = [n + i for i, (_, kind) in enumerate(plan[2]) if kind is np.random.Generator and
              states[n + i]["bit_generator"] == "Philox"]
    assert len(philox) == 1 and glob[0]["bit_generator"] == "MT19937"
    far_mt = ({**glob[0], "state": {**glob[0]["state"], "pos": 10**7}}, glob[1])
    far_philox = list(states)
    far_philox[philox[0]] = {**states[philox[0]], "buffer_pos": -3}
    for forged, position in ((sc.encode((states, far_mt)), "10000000"), (sc.encode((far_philox, glob)), "-3")):
        before = graph.dump()
        with pytest.raises(GraphStateError, match=f"position {position} lies outside"):
            graph.restore(_with_part(blob, 2, forged))
        assert graph.dump() == before
    graph.restore(blob)


def _forge_python(capsule: Capsule, blob: bytes) -> Capsule:
    slabs = [(layout, slab.clone()) for layout, slab in capsule.slabs()]
    forged = Capsule(capsule.meta, slabs)
    python, length = forged.buffer("env/python"), forged.buffer("env/python_len")
    python.zero_()
    python[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    length[0] = len(blob)
    return Capsule(forged.meta, [(layout, slab) for layout, slab in forged.slabs()])  # digests recomputed


def test_a_crafted_capsule_file_runs_nothing_through_load_and_restore(tmp_path):
    """The issue's attack end to end: a capsule file whose Python state runs a command, its digests recomputed,
    read with `load_capsule` (no key) and restored: refused by the env before a byte is copied, nothing runs."""
    env = make_env("tests.envs.broken_envs:make_counter", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    honest = snapshot(arena)
    blob = bytes(honest.buffer("env/python")[: int(honest.buffer("env/python_len")[0])].numpy())
    env.step(env.action_space.sample())
    moved = [t.numpy().tobytes() for t in snapshot(arena).tensors().values()]
    marker = tmp_path / "pwned"
    for name, payload in exploits(marker).items():
        path = save_capsule(_forge_python(honest, _with_part(blob, 2, payload)), tmp_path / f"{name}.capsule")
        with pytest.raises(CapsuleMismatchError, match="not Python state in this project's format"):
            restore(arena, load_capsule(path))
        assert not marker.exists(), name
        assert [t.numpy().tobytes() for t in snapshot(arena).tensors().values()] == moved  # untouched
    over = _forge_python(honest, blob)
    over.buffer("env/python_len")[0] = 1 << 40  # a length past the buffer
    with pytest.raises(CapsuleMismatchError, match="claims 1,099,511,627,776 bytes"):
        restore(arena, Capsule(over.meta, list(over.slabs())))
    restore(arena, honest)  # the honest capsule still restores
    env.close()


class _Viewer:
    """A suite's renderer: a class with `__del__` (opaque: the target's own) holding MuJoCo's visual structs."""

    def __init__(self):
        import mujoco

        self.cam, self.vopt, self.scn = mujoco.MjvCamera(), mujoco.MjvOption(), mujoco.MjvScene()

    def __del__(self):
        pass


class _Rendering:
    def __init__(self, viewer=True):
        self.viewer = _Viewer() if viewer else None


def test_a_renderers_camera_and_options_are_values_set_in_place():
    source, target = _Rendering(), _Rendering()
    source.viewer.cam.lookat[:] = (1.0, 2.0, 3.0)
    source.viewer.cam.distance, source.viewer.vopt.geomgroup[2], source.viewer.scn.scale = 4.5, 0, 2.0
    blob = GraphState(source).snapshot()
    viewer, cam = target.viewer, target.viewer.cam
    GraphState(target).restore(blob)
    assert target.viewer is viewer and viewer.cam is cam  # the target's own renderer, set in place
    assert list(cam.lookat) == [1.0, 2.0, 3.0] and cam.distance == 4.5
    assert viewer.vopt.geomgroup[2] == 0 and viewer.scn.scale == 2.0
    dump = GraphState(source).dump()
    assert dump[".viewer.cam"].startswith("struct MjvCamera ") and dump[".viewer.cam"] != GraphState(_Rendering()).dump()[
        ".viewer.cam"]
    # a target that has not made its renderer yet: its structs are named as missing, the rest applies
    fresh = _Rendering(viewer=False)
    prepared = GraphState(fresh).prepare(blob)
    assert set(prepared.missing_structs) == {".viewer.cam", ".viewer.vopt", ".viewer.scn"}
    GraphState(fresh).apply(prepared)
    assert fresh.viewer is None


def test_a_struct_state_of_other_fields_or_shapes_is_refused():
    import mujoco

    from capsule_rollout.envs.object_graph import VisualStructs

    structs, cam = VisualStructs(), mujoco.MjvCamera()
    state = structs.state(cam)
    structs.check(cam, state)
    with pytest.raises(ValueError, match="lookat"):
        structs.check(cam, {**state, "lookat": np.zeros(4)})
    with pytest.raises(ValueError, match="distance"):
        structs.check(cam, {**state, "distance": "far"})
    with pytest.raises(ValueError, match="fields"):
        structs.check(cam, {**state, "extra": 1})


class _Part:
    def __init__(self, value):
        self.value, self.history = value, [value]


class _Whole:
    def __init__(self):
        self.part, self.rng = _Part(1), np.random.default_rng(0)
        self.parts = [_Part(10), _Part(20)]


def test_a_capsule_restored_again_reuses_its_targets_while_the_graph_keeps_its_shape():
    """The second restore of a snapshot resolves nothing (its targets bound, the steps to them checked); an object
    replaced along a path, or removed, is found or made again, and restored as the first time."""
    whole = _Whole()
    graph = GraphState(whole, global_rngs=False)
    blob = graph.snapshot()
    draw = whole.rng.random()

    def scramble():
        whole.part.value, whole.parts[1].value = 5, 50
        whole.part.history.append(5)
        whole.rng.random()

    def same(part):
        return part.value == 1 and part.history == [1] and whole.parts[1].value == 20 and whole.rng.random() == draw

    scramble()
    graph.restore(blob)
    first = whole.part
    assert same(first) and len(graph._bound) == 1
    scramble()
    graph.restore(blob)  # bound: the same objects, set in place
    assert whole.part is first and same(first)
    whole.part = replaced = _Part(7)  # the graph changed along a path: resolved again, into the new object
    scramble()
    first.value = 99
    graph.restore(blob)
    assert whole.part is replaced and same(replaced) and first.value == 99  # the object no longer there: untouched
    whole.parts = [whole.parts[0]]  # a path the graph no longer has: the object made afresh, nothing bound
    graph._bound.clear()
    graph.restore(blob)
    assert len(whole.parts) == 2 and whole.parts[1].value == 20 and not graph._bound
    graph.restore(blob)
    assert len(graph._bound) == 1 and same(whole.part)


def test_arrays_restored_are_fresh_copies_and_an_array_held_twice_stays_one():
    whole = _Whole()
    whole.shared = np.arange(3.0)
    whole.part.same = whole.shared
    whole.frozen = np.ones(2)
    whole.frozen.flags.writeable = False
    graph = GraphState(whole, global_rngs=False)
    blob = graph.snapshot()
    for _ in range(3):  # the first restore reads; the others copy what it kept
        whole.shared[:] = 7.0
        whole.part.same = np.zeros(3)
        graph.restore(blob)
        assert whole.part.same is whole.shared and whole.shared.tolist() == [0.0, 1.0, 2.0]
        assert not whole.frozen.flags.writeable and whole.frozen.tolist() == [1.0, 1.0]
