"""`OffscreenRenderer`: fast CPU-friendly offscreen images of named cameras, on a GL context of its own."""

from __future__ import annotations

import atexit
import weakref

import mujoco
import numpy as np

from capsule_rollout.envs.gl_backend import (
    INSTALL_HINT,
    RenderingUnavailableError,
    context_class,
    prepare_first_context,
    select_backend,
)
from capsule_rollout.envs.gl_current import as_found

MAX_GEOM = 10000  # the largest scene made: mujoco.Renderer's default
SCENE_GEOMS = 1000  # the smallest
_VGEOMFULL = getattr(mujoco.mjtWarning, "mjWARN_VGEOMFULL", None)  # mujoco 3.x counts a full scene in MjData.warning
_OPEN: weakref.WeakSet = weakref.WeakSet()  # renderers not closed yet: closed at exit, while GL is still loaded


def _close_open_renderers() -> None:
    for renderer in list(_OPEN):
        try:
            renderer.close()
        except Exception:  # noqa: BLE001 - the process is ending and its GL display is gone already (a suite's
            renderer.abandon()  # own exit hook, dm_control's, terminated it first): nothing left to free


def scene_capacity(model: mujoco.MjModel) -> int:
    """Geoms a renderer's scene holds: four times what `mjv_updateScene` draws of `model` with the default options at
    most (a geom for each geom, site, flex, skin and rangefinder, a segment for each tendon and three for each of its
    wrap points), at least `SCENE_GEOMS` and at most `MAX_GEOM`. A scene of 10,000 geoms takes about 10 MB and 6 ms
    to make (measured); a scene found full is made again at `MAX_GEOM` before its image is drawn (`render`)."""
    drawn = model.ngeom + model.nsite + model.nflex + model.nskin + model.nsensor + model.ntendon + 3 * model.nwrap
    return min(MAX_GEOM, max(SCENE_GEOMS, 4 * drawn))


def _scene(model: mujoco.MjModel, maxgeom: int) -> mujoco.MjvScene:
    scene = mujoco.MjvScene(model=model, maxgeom=maxgeom)
    scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False
    scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = False
    return scene


def _track(renderer: OffscreenRenderer) -> None:
    if not _OPEN:  # the first open renderer: close whatever is left open when the process exits (registered
        atexit.unregister(_close_open_renderers)  # once at a time; at the first renderer, never at import)
        atexit.register(_close_open_renderers)
    _OPEN.add(renderer)


class OffscreenRenderer:
    """Renders `(H, W, 3) uint8` images; shadows and reflections off (about 100x faster on a CPU).

    It makes its own GL context of the backend `gl_backend.select_backend()` names, so it works whatever
    `MUJOCO_GL` was when mujoco was imported, and leaves the thread's current context as it found it (a
    suite's renderer that assumes its own stays current is not redirected). Create it only when an image is
    needed; `close()` frees the GL context.
    """

    def __init__(self, model: mujoco.MjModel, height: int, width: int) -> None:
        if model.vis.global_.offwidth < width or model.vis.global_.offheight < height:
            raise ValueError(
                f"image {width}x{height} exceeds the model's offscreen buffer "
                f"{model.vis.global_.offwidth}x{model.vis.global_.offheight}"
            )
        self._gl = self._mjr = None
        backend = select_backend()
        if backend is None:
            raise RenderingUnavailableError(f"no offscreen OpenGL library found (neither EGL nor OSMesa): {INSTALL_HINT}")
        prepare_first_context()
        self.backend = backend
        try:
            with as_found():
                self._gl = context_class(backend)(width, height)
                self._gl.make_current()
                self._mjr = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
                mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._mjr)
        except RenderingUnavailableError:
            raise
        except Exception as exc:  # GL context creation failed: say what to install
            self.close()
            raise RenderingUnavailableError(
                f"offscreen rendering failed with the {backend} backend ({type(exc).__name__}: {exc}); "
                + INSTALL_HINT
            ) from None
        self.model, self.height, self.width = model, height, width
        self.scene = _scene(model, scene_capacity(model))
        self._option = mujoco.MjvOption()
        self._rect = mujoco.MjrRect(0, 0, width, height)
        self._cameras: dict[str | int, mujoco.MjvCamera] = {}
        _track(self)

    def _camera(self, camera: str | int | mujoco.MjvCamera) -> mujoco.MjvCamera:
        """A camera as mujoco.Renderer takes one: a name, an id (-1: the free camera), or an `MjvCamera`."""
        if isinstance(camera, mujoco.MjvCamera):
            return camera
        made = self._cameras.get(camera)
        if made is None:
            index = camera
            if isinstance(camera, str):
                index = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA.value, camera)
                if index < 0:
                    raise ValueError(f"the model has no camera {camera!r}")
            if not -1 <= index < self.model.ncam:
                raise ValueError(f"camera id {index} is outside [-1, {self.model.ncam})")
            made = mujoco.MjvCamera()
            made.fixedcamid = index
            if index == -1:
                made.type = mujoco.mjtCamera.mjCAMERA_FREE
                mujoco.mjv_defaultFreeCamera(self.model, made)
            else:
                made.type = mujoco.mjtCamera.mjCAMERA_FIXED
            self._cameras[camera] = made
        return made

    def render(self, data: mujoco.MjData, camera: str | int | mujoco.MjvCamera,
               out: np.ndarray | None = None) -> np.ndarray:
        """Image of `camera` for the current `data` (call mj_forward after a state change)."""
        if self._mjr is None:
            raise RuntimeError("render called after close()")
        self._update(data, self._camera(camera))
        shape = (self.height, self.width, 3)
        if out is not None and out.shape != shape:
            raise ValueError(f"out has shape {out.shape}; this renderer makes {shape}")
        buffer = out if out is not None and out.dtype == np.uint8 and out.flags.c_contiguous else np.empty(shape, np.uint8)
        with as_found(self._gl):
            self._gl.make_current()
            mujoco.mjr_render(self._rect, self.scene, self._mjr)
            mujoco.mjr_readPixels(buffer, None, self._rect, self._mjr)
        buffer[:] = np.flipud(buffer)  # GL's first row is the image's last
        if out is not None and out is not buffer:
            np.copyto(out, buffer, casting="unsafe")
            return out
        return buffer

    def _update(self, data: mujoco.MjData, camera: mujoco.MjvCamera) -> None:
        """The scene of `data` seen from `camera`. A scene smaller than `MAX_GEOM` found full (`scene_capacity` fell
        short: the geoms past it were dropped) is made again at `MAX_GEOM` and filled again, with the count of full
        scenes that mujoco 3.x keeps in `data.warning` put back as it was: the env's state is not the renderer's to
        change. MuJoCo's own warning is still printed (and appended to `MUJOCO_LOG.TXT` in the working directory)
        when that happens; no model measured draws more than a quarter of its scene (docs/DESIGN.md)."""
        scene = self.scene
        warning = data.warning[_VGEOMFULL] if _VGEOMFULL is not None and scene.maxgeom < MAX_GEOM else None
        kept = None if warning is None else (warning.lastinfo, warning.number)
        mujoco.mjv_updateScene(self.model, data, self._option, None, camera, mujoco.mjtCatBit.mjCAT_ALL.value, scene)
        if scene.ngeom < scene.maxgeom or scene.maxgeom >= MAX_GEOM:
            return
        if warning is not None:
            warning.lastinfo, warning.number = kept
        self.scene = _scene(self.model, MAX_GEOM)
        mujoco.mjv_updateScene(self.model, data, self._option, None, camera, mujoco.mjtCatBit.mjCAT_ALL.value,
                               self.scene)

    def close(self) -> None:
        _OPEN.discard(self)
        if self._gl is None:
            return
        with as_found(self._gl):
            if self._mjr is not None:
                self._gl.make_current()
                self._mjr.free()
                self._mjr = None
            self._gl.free()
            self._gl = None

    def abandon(self) -> None:
        """Drop the GL objects without a GL call (their display is gone): MuJoCo's context class would retry
        freeing its context when collected, and fail loudly, so it is marked freed."""
        _OPEN.discard(self)
        if self._gl is not None and hasattr(self._gl, "_context"):
            self._gl._context = None
        self._mjr = self._gl = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the GL library may be gone already
            pass
