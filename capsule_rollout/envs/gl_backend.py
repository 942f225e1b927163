"""Which offscreen GL backend a renderer uses, chosen when the first renderer is made (never at import).

`MUJOCO_GL` set by the user wins (egl, osmesa or glfw). Unset, the renderer takes EGL where its libraries
are installed, else OSMesa, and creates that context itself, whatever `import mujoco` picked when the
variable was unset: so importing the project writes no environment variable, and a state-only env never
needs GL at all. When neither library is found, the first render raises `RenderingUnavailableError` saying
what to install.
"""

from __future__ import annotations

import ctypes.util
import os

INSTALL_HINT = (
    "install EGL (Debian/Ubuntu: apt-get install -y --no-install-recommends libegl1 libopengl0 "
    "libgl1-mesa-dri) or OSMesa (apt-get install -y libosmesa6 and set MUJOCO_GL=osmesa), "
    "or run the env state-only (cameras=())"
)
OFFSCREEN = ("egl", "osmesa")


class RenderingUnavailableError(RuntimeError):
    """No offscreen OpenGL backend works on this machine."""


def _have(*libs: str) -> bool:
    return all(ctypes.util.find_library(lib) for lib in libs)


def select_backend() -> str | None:
    """The backend a renderer made now uses: `MUJOCO_GL` when set, else egl or osmesa by which libraries
    are installed (None: neither). Reads the environment, never writes it."""
    chosen = os.environ.get("MUJOCO_GL", "").lower().strip()
    if chosen:
        return chosen
    if _have("EGL", "OpenGL"):
        return "egl"
    if _have("OSMesa"):
        return "osmesa"
    return None


def context_class(backend: str) -> type:
    """MuJoCo's GL context class for `backend` (imported now: `mujoco.egl` and `mujoco.osmesa` load their
    libraries at import)."""
    if backend == "egl":
        from mujoco.egl import GLContext
    elif backend == "osmesa":
        from mujoco.osmesa import GLContext
    elif backend == "glfw":
        from mujoco.glfw import GLContext
    else:
        raise RenderingUnavailableError(f"MUJOCO_GL={backend!r} is not an offscreen backend this renderer "
                                        f"knows: use one of {OFFSCREEN} or glfw (needs a display)")
    return GLContext


def prepare_first_context() -> None:
    """What has to happen before this process's first GL context, done once, when a renderer is made.

    - Mesa's llvmpipe (the CPU rasteriser) renders small images about 25% faster without its worker
      threads, which would also compete with the simulation for cores: `LP_NUM_THREADS=0` unless the user
      set it (only Mesa reads it; GPU drivers ignore it).
    - Triton's native library is loaded before Mesa loads its own LLVM: both bundle LLVM, and when Mesa
      has created a GL context first, loading `triton._C.libtriton` afterwards (torch does so lazily, e.g.
      when an optimizer is built) crashes the process with a segmentation fault; in the other order both
      work. A no-op where Triton is not installed.
    """
    os.environ.setdefault("LP_NUM_THREADS", "0")
    load_triton_first()


def load_triton_first() -> None:
    """Load Triton's native library now if it is installed (see `prepare_first_context`)."""
    try:
        import triton._C.libtriton  # noqa: F401
    except ImportError:
        pass
