"""Choose MuJoCo's offscreen GL backend before mujoco is imported.

EGL by default, OSMesa when EGL's libraries are missing, and a clear error (at the
first render, not at import) when neither is installed, so state-only envs still
work on such a machine. A `MUJOCO_GL` already set by the user is respected.
"""

from __future__ import annotations

import ctypes.util
import os

INSTALL_HINT = (
    "install EGL (Debian/Ubuntu: apt-get install -y --no-install-recommends libegl1 libopengl0 "
    "libgl1-mesa-dri) or OSMesa (apt-get install -y libosmesa6 and set MUJOCO_GL=osmesa), "
    "or run the env state-only (cameras=())"
)


class RenderingUnavailableError(RuntimeError):
    """No offscreen OpenGL backend works on this machine."""


def _have(*libs: str) -> bool:
    return all(ctypes.util.find_library(lib) for lib in libs)


def select_backend() -> str | None:
    """Set MUJOCO_GL if unset; returns the backend in use (None: none found)."""
    chosen = os.environ.get("MUJOCO_GL")
    if chosen:
        return chosen
    if _have("EGL", "OpenGL"):
        chosen = "egl"
    elif _have("OSMesa"):
        chosen = "osmesa"
    else:
        return None  # mujoco then defaults to glfw, which imports fine and fails at render time
    os.environ["MUJOCO_GL"] = chosen
    os.environ.setdefault("PYOPENGL_PLATFORM", chosen)
    return chosen


BACKEND = select_backend()
# Mesa's llvmpipe (CPU rasteriser) renders small images about 25% faster without
# its worker threads, which would also compete with the simulation for cores.
# Only Mesa reads this variable; GPU drivers ignore it.
os.environ.setdefault("LP_NUM_THREADS", "0")


def load_triton_first() -> None:
    """Load Triton's native library before Mesa loads its own LLVM.

    Both bundle LLVM. When Mesa's llvmpipe has created a GL context first, loading
    `triton._C.libtriton` afterwards (torch does so lazily, e.g. when an optimizer is
    built) crashes the process with a segmentation fault; in the other order both
    work. Called before the first GL context; a no-op where Triton is not installed.
    """
    try:
        import triton._C.libtriton  # noqa: F401
    except ImportError:
        pass
