"""The thread's current GL context, kept as a suite's renderer expects it (EGL).

A suite's own renderer is state outside MjData that no capsule can hold: a GL context and the objects in it
(robosuite's `MjRenderContext`, gymnasium's `OffScreenViewer`, dm_control's contexts). robosuite and
gymnasium render with their context assumed current and never make it current again (dm_control believes
its own is current while it last made it so), and all of them free their objects by name in whatever context
is current when Python frees them (GL names are per context: a dropped robosuite simulator's
`mjr_freeContext` deletes the textures and framebuffers of whichever context is current; MuJoCo's EGL class
then releases the thread's context). Three rules keep their images a function of MjData:

- `EnvContext.turn`: an env's own context is current during the adapter's calls into it, none between them;
- `as_found`: the framework's renderer leaves the thread's current context as it found it;
- `collect_with_no_context`: the garbage collector runs with no context current (a `gc.callbacks` hook,
  installed once by the first env adapter): what it frees touches no live context.

EGL only, through libEGL's own entry points (no PyOpenGL platform chosen); OSMesa's and GLFW's current
context are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Iterator
from typing import Any

EGL_DRAW, EGL_READ = 0x3059, 0x305A
_lib: Any = None


def _egl() -> Any:
    """libEGL with the four calls used here, loaded at the first use (None: no libEGL)."""
    global _lib
    if _lib is None:
        name = ctypes.util.find_library("EGL")
        if name is None:
            _lib = False
            return None
        lib = ctypes.CDLL(name)
        for fn in ("eglGetCurrentContext", "eglGetCurrentDisplay"):
            getattr(lib, fn).restype, getattr(lib, fn).argtypes = ctypes.c_void_p, []
        lib.eglGetCurrentSurface.restype, lib.eglGetCurrentSurface.argtypes = ctypes.c_void_p, [ctypes.c_int32]
        lib.eglMakeCurrent.restype = ctypes.c_uint
        lib.eglMakeCurrent.argtypes = [ctypes.c_void_p] * 4
        _lib = lib
    return _lib or None


def current() -> tuple[int, int, int, int] | None:
    """(display, draw surface, read surface, context) current on this thread; None when none is."""
    lib = _egl()
    if lib is None:
        return None
    context = lib.eglGetCurrentContext()
    if not context:
        return None
    return lib.eglGetCurrentDisplay(), lib.eglGetCurrentSurface(EGL_DRAW), lib.eglGetCurrentSurface(EGL_READ), context


def make_current(state: tuple[int, int, int, int]) -> None:
    _egl().eglMakeCurrent(*state)


def release(state: tuple[int, int, int, int]) -> None:
    """No context current on this thread (`state`: what is current now)."""
    _egl().eglMakeCurrent(state[0], None, None, None)


def context_address(gl_context: Any) -> int | None:
    """The EGL context a MuJoCo `GLContext` holds, as an address (None: not an EGL one, or freed)."""
    handle = getattr(gl_context, "_context", None)
    return getattr(handle, "address", None) if handle else None


@contextlib.contextmanager
def as_found(own: Any = None) -> Iterator[None]:
    """The thread's current context when the block starts (another renderer's, or none) is current again when
    it ends, whatever the block made current, created or freed; `own` (the block's MuJoCo `GLContext`) found
    current counts as none."""
    before = current()
    if before is not None and before[3] == context_address(own):
        before = None
    try:
        yield
    finally:
        now = current()
        if before is None:
            if now is not None:
                release(now)
        elif now is None or now[3] != before[3]:
            make_current(before)


class EnvContext:
    """The GL context one env's own renderer keeps current (robosuite's, gymnasium's viewer, dm_control's),
    current during the env's calls only (`turn`), none between them: several envs in one thread (an actor's
    slots) each render in their own, and a renderer another env frees deletes nothing of theirs. Taken at
    construction from what the env's constructor left current."""

    def __init__(self) -> None:
        self.state = current()
        if self.state is not None:
            release(self.state)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        if self.state is not None:
            make_current(self.state)
        try:
            yield
        finally:
            self.state = current()  # a suite that rebuilt its renderer (robosuite at reset) made a new one current
            if self.state is not None:
                release(self.state)


_released: list[tuple[int, int, int, int] | None] = []


def _around_collection(phase: str, info: dict) -> None:
    if phase == "start":
        state = current()
        if state is not None:
            release(state)
        _released.append(state)
    elif _released:
        state = _released.pop()
        if state is not None:
            make_current(state)


def collect_with_no_context() -> None:
    """Have every garbage collection in this process run with no GL context current (idempotent)."""
    if _around_collection not in gc.callbacks and _egl() is not None:
        gc.callbacks.append(_around_collection)
