"""The thread's current GL context as a suite's renderer expects it (`envs.gl_current`): the framework's renderer
leaves it as it found it, an env's own context is current during its calls only, and the garbage collector
runs with none current."""

from __future__ import annotations

import gc

import mujoco
import pytest

from capsule_rollout.envs import gl_current
from capsule_rollout.envs.gl_backend import prepare_first_context, select_backend
from capsule_rollout.envs.offscreen_renderer import OffscreenRenderer

pytestmark = pytest.mark.skipif(select_backend() != "egl" or gl_current._egl() is None,
                                reason="EGL only")


@pytest.fixture
def suite_context():
    """A GL context of a suite's own (MuJoCo's EGL class, as gymnasium and robosuite make theirs), current."""
    prepare_first_context()  # Triton's LLVM before Mesa's, as every renderer does
    from mujoco.egl import GLContext

    ctx = GLContext(8, 8)
    ctx.make_current()
    yield ctx
    ctx.free()


def _current_address():
    state = gl_current.current()
    return None if state is None else state[3]


def test_the_framework_renderer_leaves_the_context_it_found(suite_context):
    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='.1'/></worldbody></mujoco>")
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    renderer = OffscreenRenderer(model, 16, 16)  # made, drawn and freed with the suite's context current
    renderer.render(data, -1)
    assert _current_address() == gl_current.context_address(suite_context)
    renderer.close()
    assert _current_address() == gl_current.context_address(suite_context)
    gl_current.release(gl_current.current())
    renderer = OffscreenRenderer(model, 16, 16)
    renderer.render(data, -1)
    assert gl_current.current() is None  # none current before, none after
    renderer.close()


def test_an_env_context_is_current_during_its_turn_only(suite_context):
    own = gl_current.EnvContext()  # what the env's constructor left current
    assert gl_current.current() is None
    with own.turn():
        assert _current_address() == gl_current.context_address(suite_context)
    assert gl_current.current() is None


class _Renderer:
    """Freed by the garbage collector only (a cycle, as robosuite's simulator and its render context)."""

    seen: list = []

    def __init__(self):
        self.me = self

    def __del__(self):
        _Renderer.seen.append(gl_current.current())


def test_the_garbage_collector_runs_with_no_context_current(suite_context):
    gl_current.collect_with_no_context()
    gl_current.collect_with_no_context()
    assert gc.callbacks.count(gl_current._around_collection) == 1
    _Renderer.seen.clear()
    _Renderer()
    gc.collect()
    assert _Renderer.seen == [None]  # what it frees would delete objects of the current context by name
    assert _current_address() == gl_current.context_address(suite_context)  # and current again after
