"""`MujocoCapsuleEnv`: any gymnasium MuJoCo env as a rollout-protocol env with a bit-exact capsule.

A third-party env keeps its state in many places; the adapter captures all of it
in arena buffers (component "env"):

- `mjdata`: the whole model-sized `MjData` buffer (every array MuJoCo sizes from
  the model: qpos, qvel, act, ctrl, mocap, warm-start, and the derived arrays:
  body and geom poses, sites, cameras, sensors, contact forces...) and `time`.
  That is `mjSTATE_INTEGRATION` and more: an env that reads derived data before
  `mj_step` (a reward from the torso position, a mocap action from `xpos`) sees
  at a restore exactly what it saw at the snapshot, and no `mj_forward` runs
  (which would recompute those arrays from the new positions, not the stale
  ones `mj_step` leaves). Constraint and contact arrays (MjData's arena) are not
  captured: `mj_step` recomputes them before using them.
- `model_<field>`: the `MjModel` arrays a suite edits at run time (declared by name).
- `rng`: every numpy PCG64 generator reachable from the env: each wrapper layer,
  the env, nested envs and their spaces (found at construction).
- `attrs`: Python attributes declared per suite with fixed shapes and the
  counters of known wrappers (`TimeLimit`'s elapsed steps...). A wrapper that
  keeps state the adapter does not know is refused at construction.
- With graph capture (`CaptureSpec.graph`, the default), nothing is declared
  instead: `python` holds the env's whole Python object graph (`envs.object_graph`)
  in a bounded slab, `model` every MjModel array that is not an asset, and
  `physics_flags` whether MjData was left by `mj_step1` (a restore then reruns it,
  rebuilding the arena an `mj_step2`-first suite such as dm_control reads).
- `obs_*`: the observation returned at the boundary and the camera images
  (recomputing them after a restore does not reproduce them: frame stacks
  shift, noise is drawn again).

The declared path's restores copy bytes only: a precomputed list of `memmove`s
into MjData, the model and each generator's C state, then the declared
attributes; graph capture adds unpickling the Python state into the env's objects.

Images come from the adapter's own renderer with explicit cameras (a named model
camera or fixed free-camera parameters), never from the suite's viewer, whose
camera depends on the geometry at its first render, and which may move sites.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch

from capsule_rollout.capsules import BufferComponent, BufferSpec, Trust, host_arrays
from capsule_rollout.capsules.trust import current_trust
from capsule_rollout.envs.gl_current import EnvContext, collect_with_no_context
from capsule_rollout.envs.mujoco_capture import (  # noqa: F401 - the declarations are part of this module's API
    _LOADERS,
    KNOWN_WRAPPERS,
    OBSERVATION_KEY,
    PHYSICS_FIELDS,
    WRAPPER_COUNTER_TYPES,
    WRAPPER_PLUMBING,
    Attr,
    Camera,
    CaptureSpec,
    MujocoCapsuleError,
    _load,
    _store,
    check_wrappers,
    find_generators,
    find_physics,
    flatten,
    integer_bytes,
    layers_of,
    memory_view,
    mjdata_buffer,
    mjv_camera,
    model_identity,
    model_value_runs,
    native_leaves,
    pcg64_addresses,
    resolve_attr,
    slab_overflow,
    slab_size,
    space_bytes,
    zeros_like_space,
)
from capsule_rollout.envs.mujoco_python_state import MujocoPythonState
from capsule_rollout.envs.object_graph import GraphState, GraphStateError
from capsule_rollout.envs.offscreen_renderer import OffscreenRenderer
from capsule_rollout.envs.rollout_env import ArraySpec, ObservationSpec, image_key

DIRECT_BYTES = 256 * 1024
"""From this size of MjData's buffer on, a restore copies it (and the model's runs) from the capsule straight into
MjData (`direct_buffers`) instead of into the arena and then from there. Below it the copy saved costs no more than the
calls the direct path adds (paired in one process, restore / through the arena: SO-101's 664 KB 0.93x, Adroit door's
124 KB 1.01x, AntMaze's 27 KB 1.01x, PointMaze's 7 KB 1.03x)."""


class MujocoCapsuleEnv(MujocoPythonState, BufferComponent):
    """A gymnasium MuJoCo env (with its wrappers) as a `RolloutEnv` whose whole state a capsule holds."""

    restorable = True

    def __init__(self, env: gym.Env, capture: CaptureSpec, *, cameras: Sequence[str] = (), image_size: int = 64,
                 max_steps: int | None = None) -> None:
        super().__init__()
        self.name = "env"
        # the env's own renderer's GL context: current during its calls only; a renderer the garbage collector
        # frees touches no live context (`gl_current`)
        collect_with_no_context()
        self._gl_env = EnvContext()
        self.env, self.capture = env, capture
        self.unwrapped = env.unwrapped
        self.model, self.data, self._physics_path = find_physics(env)
        if self.model.nplugin:
            raise MujocoCapsuleError(f"{capture.task}: models with plugins are not supported (MjData holds plugin "
                                     "pointers)")
        unknown = [c for c in cameras if c not in capture.cameras]
        if unknown:
            raise ValueError(f"{capture.task}: unknown camera(s) {unknown}; declared: {sorted(capture.cameras)}")
        self.cameras, self.image_size = tuple(cameras), int(image_size)
        self.max_steps = int(max_steps or capture.max_steps)
        self.action_space = env.action_space
        self.layers = layers_of(env)
        self._graph = GraphState(env, exclude=capture.exclude) if capture.graph else None
        if self._graph is not None:  # wrappers, generators and seeds are part of the graph
            self._wrapper_attrs, self._generators, seeds = [], [], []
        else:
            self._wrapper_attrs = check_wrappers(self.layers, capture)
            self._generators = find_generators(self.layers)
            # gymnasium records the seed beside each env's generator (`np_random_seed`): captured with it
            seeds = [(owner, "_np_random_seed", Attr(f"{path.rsplit('.', 1)[0]}._np_random_seed", "int"))
                     for path, owner, name in self._generators
                     if name == "_np_random" and isinstance(owner, gym.Env) and "_np_random_seed" in vars(owner)]
        self._attrs = [(*resolve_attr(self.unwrapped, a.path), a) for a in capture.attributes] + self._wrapper_attrs + seeds
        self._model_fields = [(name, getattr(self.model, name)) for name in capture.model_fields]
        for name, arr in self._model_fields:
            if not isinstance(arr, np.ndarray):
                raise MujocoCapsuleError(f"{capture.task}: model field {name!r} is not an MjModel array")
        self._renderer: OffscreenRenderer | None = None
        self._attach(self.model, self.data)
        self._static_digest = self._graph.remember_static() if self._graph is not None else ""
        self._python_bytes = self._slab_size() if self._graph is not None else 0
        self._prepared: tuple[bytes, Any] | None = None  # the Python state check_restore read
        self._unrendered: set[str] = set()  # struct paths a render of the env did not make
        raw = self._probe_observation()
        self._obs_dim = raw.shape[0]
        state_dim = self._state(raw_obs=None, flat=raw).shape[0]
        # the env's own observation, as it gives it: each leaf under its key, its shape and dtype kept
        self._natives = native_leaves(self._kept_space(), self.capture.task)
        extra = {key: ArraySpec(shape, dtype) for key, _, shape, dtype in self._natives}
        self.observation_spec = ObservationSpec.of(state_dim=state_dim, cameras=self.cameras,
                                                   image_size=self.image_size, **extra)
        self._mjv_cameras = {c: mjv_camera(self.model, capture.cameras[c], capture.task) for c in self.cameras}
        self._fingerprint = self._make_fingerprint()
        self._plan: list[tuple[int, str, int, int]] = []
        # copied from the capsule by after_restore, not through the arena (`restore_direct`), where that pays
        self.direct_buffers = (("mjdata", "model") if self._graph is not None else ("mjdata",)) \
            if self._buffer_bytes >= DIRECT_BYTES else ()
        self._direct_from: Mapping[str, np.ndarray] | None = None
        self._direct_plan: tuple[Mapping[str, np.ndarray], list, list[tuple[int, int, int]]] | None = None
        # until an arena binds its buffers, the env runs on private ones of the same specs
        self._bind_views({s.name: torch.zeros(s.shape, dtype=s.dtype) for s in self.buffer_specs()}, carry=False)

    # -- discovery --------------------------------------------------------------------
    def _attach(self, model: mujoco.MjModel, data: mujoco.MjData) -> None:
        """Take `model` / `data` as the env's simulation: at construction, and with graph capture whenever the
        env has built new ones (robosuite recompiles its model at every reset), which must have the sizes of
        the first."""
        first = not hasattr(self, "_buffer_bytes")
        ptr, nbytes = mjdata_buffer(data)
        runs = model_value_runs(model) if self._graph is not None else []
        if not first and (nbytes != self._buffer_bytes or sum(n for _, n in runs) != self._model_bytes):
            raise MujocoCapsuleError(f"{self.capture.task} built a new MjModel / MjData of other sizes (MjData buffer "
                                     f"{nbytes:,} bytes, was {self._buffer_bytes:,}): a capsule holds one layout")
        self.model, self.data = model, data
        self._buffer_ptr, self._buffer_bytes = ptr, nbytes
        # where the physics state lies in the captured buffer (bytes): a capsule with NaN / inf there is refused
        self._physics = [(name, arr.ctypes.data - ptr, arr.nbytes) for name in PHYSICS_FIELDS
                         if (arr := getattr(data, name)).nbytes and arr.dtype == np.float64
                         and 0 <= arr.ctypes.data - ptr <= nbytes - arr.nbytes]
        # the same as float64 element indices into the buffer, checked with one gather on every restore
        self._physics_index = np.concatenate([np.arange(offset // 8, (offset + n) // 8)
                                              for _, offset, n in self._physics] or [np.zeros(0, np.int64)])
        if any(offset % 8 for _, offset, _ in self._physics):
            raise MujocoCapsuleError(f"this MuJoCo ({mujoco.__version__}) lays MjData's float64 arrays out unaligned")
        # graph capture: every model array that is not an asset, as a few contiguous runs of the model's memory
        self._model_runs = runs
        self._model_bytes = sum(n for _, n in runs)
        # the integer arrays among them (indices, types, flags: read by MuJoCo unchecked), which a capsule restored
        # as data never changes (`_refuse_structure`)
        self._model_ints = integer_bytes(model, runs)
        if self._graph is not None:
            self._scratch = mujoco.MjData(model)
            self._scratch_ptr = mjdata_buffer(self._scratch)[0]
            self._scratch_view = memory_view(self._scratch_ptr, nbytes)
        # the framework's renderer draws without multisampling (with shadows off: ~100x faster on a CPU); a
        # visual setting of the model only, read by no physics routine
        model.vis.quality.offsamples = 0
        if self._renderer is not None:  # made for the old model
            self._renderer.close()
            self._renderer = None
        if not first and hasattr(self, "_np"):
            self._make_plan(self._np)

    def _follow_rebuilds(self) -> None:
        """With graph capture, re-attach when the env has replaced its MjModel / MjData (cheap when it has not:
        the MjData is looked up where it was found)."""
        model, data, self._physics_path = find_physics(self.env, self._physics_path)
        if data is not self.data or model is not self.model:
            self._attach(model, data)

    def _slab_size(self) -> int:
        if self.capture.python_bytes is not None:
            return int(self.capture.python_bytes)
        try:
            held = len(self._graph.snapshot())
        except GraphStateError as exc:
            raise MujocoCapsuleError(f"{self.capture.task}: {exc}") from None
        return slab_size(held, space_bytes(getattr(self.env, "observation_space", None)))

    def _probe_observation(self) -> np.ndarray:
        space = getattr(self.env, "observation_space", None)
        try:
            sample = flatten(self._kept(zeros_like_space(space)))
        except TypeError:
            raise MujocoCapsuleError(f"{self.capture.task}: observation space {space} is not made of Boxes and "
                                     "Dicts; give the suite a `state` function") from None
        return sample

    def _make_fingerprint(self) -> dict[str, str]:
        if self._graph is not None:
            blob = model_identity(self.model, self._model_runs)
        else:
            saved = [(arr, arr.copy()) for _, arr in self._model_fields]
            for arr, _ in saved:
                arr[...] = 0  # run-time edits are state, not identity
            size = mujoco.mj_sizeModel(self.model)
            blob = np.zeros(size, np.uint8)
            mujoco.mj_saveModel(self.model, None, blob)
            for arr, value in saved:
                arr[...] = value
        declared = {"attributes": [repr(a) for a in self.capture.attributes], "model": list(self.capture.model_fields),
                    "wrappers": [type(x).__name__ for x in self.layers],
                    "generators": [p for p, _, _ in self._generators],
                    "cameras": {c: repr(self.capture.cameras[c]) for c in self.cameras}, "size": self.image_size,
                    **({"graph": {"exclude": sorted(self.capture.exclude), "python_bytes": self._python_bytes,
                                  "model_runs": self._model_bytes, "static": self._static_digest}}
                       if self._graph is not None else {})}
        return {"task": self.capture.task, "mujoco": mujoco.__version__,
                "model_sha256": hashlib.sha256(blob.tobytes()).hexdigest()[:32],
                "capture_sha256": hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()[:16]}

    # -- capsule component ------------------------------------------------------------
    def buffer_specs(self) -> list[BufferSpec]:
        specs = [
            BufferSpec("mjdata", (self._buffer_bytes,), torch.uint8, doc="MjData's model-sized buffer, all arrays"),
            BufferSpec("time", (1,), torch.float64, doc="MjData.time"),
            BufferSpec("rng", (max(1, len(self._generators)), 5), torch.int64,
                       doc="PCG64 words of every generator: state lo/hi, inc lo/hi, has_uint32|uinteger"),
            BufferSpec("rng_present", (max(1, len(self._generators)),), torch.bool, doc="generator exists"),
            BufferSpec("attrs", (max(1, sum(a.slots for *_, a in self._attrs)),), torch.float64,
                       doc="declared Python attributes and wrapper counters"),
            BufferSpec("attrs_present", (max(1, len(self._attrs)),), torch.bool, doc="attribute is not None"),
            BufferSpec("counters", (2,), torch.int64, doc="control steps, reset called"),
            BufferSpec("obs_state", (self.observation_spec.state_dim,), torch.float32, doc="boundary state vector"),
        ]
        specs += [BufferSpec(f"obs_native_{i}", shape, _torch_dtype(dtype), doc=f"boundary observation {key!r}")
                  for i, (key, _, shape, dtype) in enumerate(self._natives)]
        specs += [BufferSpec(f"model_{name}", arr.shape, _torch_dtype(arr.dtype), doc=f"MjModel.{name}")
                  for name, arr in self._model_fields]
        if self._graph is not None:
            specs += [
                BufferSpec("python", (self._python_bytes,), torch.uint8, doc="the env's Python object graph (state_codec)"),
                BufferSpec("python_len", (1,), torch.int64, doc="bytes used in `python`"),
                BufferSpec("model", (max(1, self._model_bytes),), torch.uint8,
                           doc="every MjModel array that is not an asset (contiguous runs)"),
                BufferSpec("physics_flags", (1,), torch.int64, doc="1: MjData was left by mj_step1 (rerun at restore)"),
            ]
        specs += [BufferSpec(f"obs_{image_key(c)}", (self.image_size, self.image_size, 3), torch.uint8,
                             doc=f"boundary image of camera {c}") for c in self.cameras]
        return specs

    def bind(self, buffers: Mapping[str, torch.Tensor]) -> None:
        super().bind(buffers)
        self._bind_views(self.buffers, carry=True)

    def _bind_views(self, buffers: Mapping[str, torch.Tensor], carry: bool) -> None:
        b = {k: v.numpy() for k, v in buffers.items()}
        if carry:  # what the env did before the arena existed (a reset, steps) carries over
            for key in ("counters", "obs_state", *(f"obs_native_{i}" for i in range(len(self._natives))),
                        *(f"obs_{image_key(c)}" for c in self.cameras)):
                b[key][...] = self._np[key]
        self._np = b
        self._counters = b["counters"]
        self._time = b["time"]
        self._make_plan(b)
        # (owner, attribute, row, row address, index): addresses precomputed, none looked up per restore
        self._rng_rows = [(owner, name, b["rng"][i], b["rng"][i].ctypes.data, i)
                          for i, (_, owner, name) in enumerate(self._generators)]
        # per generator slot: (the generator last seen there, its state's address, its aux address); one
        # entry per slot, so the generators that seeded resets replace each other instead of piling up
        self._rng_ptrs: dict[int, tuple[object, int, int]] = {}
        offset, self._attr_views = 0, []
        for i, (owner, name, attr) in enumerate(self._attrs):
            view = b["attrs"][offset: offset + attr.slots]
            if attr.kind == "array":
                view = view.view(np.uint8)[: int(np.prod(attr.shape, dtype=np.int64)) * np.dtype(attr.dtype).itemsize]
                view = view.view(attr.dtype).reshape(attr.shape)
            self._attr_views.append((owner, name, attr, view, i))
            offset += attr.slots
        self._images = {c: b[f"obs_{image_key(c)}"] for c in self.cameras}
        self._native_views = [(key, path, b[f"obs_native_{i}"]) for i, (key, path, _, _) in enumerate(self._natives)]
        self._rng_present, self._attrs_present = b["rng_present"], b["attrs_present"]
        self._attr_loads = [(owner, name, _LOADERS[attr.kind] if attr.kind in _LOADERS else
                             (lambda v, attr=attr: _load(attr, v)), view, i)
                            for owner, name, attr, view, i in self._attr_views]

    def _make_plan(self, b: dict[str, np.ndarray]) -> None:
        # the static part of every restore: (destination, source buffer, offset in it, bytes) into MjData and MjModel
        plan = [(self._buffer_ptr, "mjdata", 0, self._buffer_bytes)]
        plan += [(arr.ctypes.data, f"model_{name}", 0, arr.nbytes) for name, arr in self._model_fields]
        if self._graph is not None:
            # the model's runs: (arena address, model address, bytes) for a snapshot, from the capsule for a restore
            self._model_copies, at, offset = [], b["model"].ctypes.data, 0
            for address, n in self._model_runs:
                self._model_copies.append((at + offset, address, n))
                plan.append((address, "model", offset, n))
                offset += n
        self._plan = plan
        self._arena_bases = {key: b[key].ctypes.data for _, key, _, _ in plan}
        self._arena_plan = self._resolved(self._arena_bases)

    def _resolved(self, bases: Mapping[str, int]) -> list[tuple[int, int, int]]:
        """The plan as (destination, source, bytes), its sources at `bases` (each buffer's address)."""
        return [(dst, bases[key] + offset, n) for dst, key, offset, n in self._plan]

    def restore_direct(self, view: Mapping[str, torch.Tensor]) -> None:
        """The capsule's MjData image (and with graph capture its model runs) copied by `after_restore` straight into
        MjData and MjModel (`direct_buffers`), not into the arena first: one copy of the largest buffer instead of
        two."""
        self._direct_from = host_arrays(view)

    def fingerprint(self) -> Mapping[str, str]:
        return self._fingerprint

    def check_restore(self, view: Mapping[str, torch.Tensor]) -> None:
        """Refuse non-finite physics (NaN or infinity in positions, velocities, controls...), whatever a capsule
        file's digests say: MuJoCo would go unstable from it."""
        b = host_arrays(view)  # numpy views, kept with the capsule: no torch call on a restore's path
        raw = b["mjdata"]
        words = raw[: raw.size // 8 * 8].view(np.float64)
        if not (np.isfinite(words[self._physics_index]).all() and math.isfinite(b["time"][0])):
            bad = [name for name, offset, nbytes in self._physics
                   if not np.isfinite(raw[offset : offset + nbytes].view(np.float64)).all()]
            raise ValueError(f"the capsule holds non-finite physics state ({', '.join(bad) or 'time'}): refusing it")
        if current_trust() is Trust.DATA:
            self._refuse_structure(b)
        if self._graph is not None:
            # the Python state read, checked and resolved before anything is copied (applied in after_restore)
            n = int(b["python_len"][0])
            if not 0 <= n <= self._python_bytes:
                raise ValueError(f"the capsule's Python state claims {n:,} bytes of a {self._python_bytes:,} buffer")
            blob = b["python"][:n].tobytes()
            try:
                self._prepared = (blob, self._graph.prepare(blob, self._natives_in(b)))
            except GraphStateError as exc:
                raise ValueError(str(exc)) from None

    def _refuse_structure(self, b: Mapping[str, np.ndarray]) -> None:
        """A capsule restored as data (`Trust.DATA`) sets MuJoCo's values, never its structure: MjModel's integer
        arrays (addresses, ids, types, flags), which MuJoCo reads as positions in its own arrays unchecked (one
        crafted address crashes the process at the restore's `mj_step1`), must hold what the env built here holds."""
        changed = [name for offset, address, n, name in self._model_ints
                   if b["model"][offset: offset + n].tobytes() != ctypes.string_at(address, n)]
        changed += [name for name, arr in self._model_fields
                    if arr.dtype.kind != "f" and b[f"model_{name}"].tobytes() != arr.tobytes()]
        if changed:
            names = sorted(set(changed))
            raise ValueError(f"the capsule's MjModel.{', MjModel.'.join(names[:6])}{' ...' if len(names) > 6 else ''} "
                             "(integer arrays: indices, types, flags) differ from the env built here: a capsule "
                             "restored as data sets MuJoCo's values, never its structure, which MuJoCo reads "
                             "unchecked. Restore it with --trust-code only if you would run this file as code")

    def before_snapshot(self) -> None:
        b = self._np
        if self._graph is not None:
            self._follow_rebuilds()
        elif find_physics(self.env, self._physics_path)[1] is not self.data:
            raise MujocoCapsuleError(f"{self.capture.task} replaced its MjModel / MjData after construction; "
                                     "the declared capture needs them to live as long as the env (graph capture "
                                     "follows a suite that rebuilds them)")
        ctypes.memmove(b["mjdata"].ctypes.data, self._buffer_ptr, self._buffer_bytes)
        self._time[0] = self.data.time
        if self._graph is not None:
            self._snapshot_graph(b)
        for name, arr in self._model_fields:
            b[f"model_{name}"][...] = arr
        present = b["rng_present"]
        for owner, name, _, row, i in self._rng_rows:
            gen = getattr(owner, name, None)
            present[i] = gen is not None
            if gen is not None:
                pcg, aux = self._pointers(gen, i)
                ctypes.memmove(row, pcg, 32)
                ctypes.memmove(row + 32, aux, 8)
        flags = b["attrs_present"]
        for owner, name, attr, view, i in self._attr_views:
            value = getattr(owner, name)
            flags[i] = value is not None
            if value is not None:
                _store(attr, value, view, self.capture.task, (self._buffer_ptr, self._buffer_bytes))

    def after_restore(self) -> None:
        arrays, self._direct_from = self._direct_from, None  # the capsule's buffers, given by restore_direct
        if self._graph is not None:
            self._follow_rebuilds()
            prepared = self._prepared_graph()
        memmove = ctypes.memmove
        plan = self._arena_plan
        if arrays is not None:  # this restore's MjData image and model runs, straight from the capsule
            kept = self._direct_plan  # for the capsule last restored (a host restores one again and again)
            if kept is None or kept[0] is not arrays or kept[1] is not self._plan:
                direct = {key: arrays[key].ctypes.data for key in self.direct_buffers}
                kept = self._direct_plan = (arrays, self._plan, self._resolved({**self._arena_bases, **direct}))
            plan = kept[2]
        for dst, src, n in plan:
            memmove(dst, src, n)
        self.data.time = self._time[0]
        if self._graph is not None:
            if self._np["physics_flags"][0] & 1:
                mujoco.mj_step1(self.model, self.data)  # the arena as mj_step1 left it (checked at the snapshot)
            self._graph.apply(prepared)
        present = self._rng_present
        for owner, name, _, row, i in self._rng_rows:
            if present[i]:
                gen = getattr(owner, name)
                if gen is None:
                    gen = np.random.Generator(np.random.PCG64())
                    setattr(owner, name, gen)
                cached = self._rng_ptrs.get(i)
                pcg, aux = (cached[1], cached[2]) if cached is not None and cached[0] is gen else self._pointers(gen, i)
                memmove(pcg, row, 32)
                memmove(aux, row + 32, 8)
            elif getattr(owner, name) is not None:
                setattr(owner, name, None)
        flags = self._attrs_present
        for owner, name, load, view, i in self._attr_loads:
            setattr(owner, name, load(view) if flags[i] else None)

    def _pointers(self, gen: np.random.Generator, slot: int) -> tuple[int, int]:
        """Addresses of a PCG64 generator's 128-bit state + increment and of its (has_uint32, uinteger)."""
        cached = self._rng_ptrs.get(slot)
        if cached is not None and cached[0] is gen:
            return cached[1], cached[2]
        bg = gen.bit_generator
        if type(bg).__name__ != "PCG64":
            raise MujocoCapsuleError(f"{self.capture.task}: a {type(bg).__name__} generator cannot be captured; "
                                     "only PCG64 (numpy's default_rng, gymnasium's np_random)")
        pcg, aux = pcg64_addresses(bg)
        self._rng_ptrs[slot] = (gen, pcg, aux)
        return pcg, aux

    # -- rollout protocol -------------------------------------------------------------
    @property
    def steps(self) -> int:
        return int(self._counters[0])

    @property
    def task(self) -> str:
        return self.capture.task

    @property
    def instruction(self) -> str:
        return self.capture.instruction

    @property
    def subtask_texts(self) -> tuple[str, ...]:
        return ()

    @property
    def subtask_index(self) -> int:
        return 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None and self.capture.seed is not None:
            self.capture.seed(self.env, int(seed))
        with self._gl_env.turn():
            raw, info = self.env.reset(seed=seed, options=options)
        if self._graph is not None:
            self._follow_rebuilds()
        self._counters[:] = (0, 1)
        self._commit(raw)
        return self.observe(), info

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        if not self._counters[1]:
            raise RuntimeError("call reset() before step()")
        with self._gl_env.turn():
            raw, reward, terminated, truncated, info = self.env.step(np.asarray(action, dtype=self.action_space.dtype))
        self._counters[0] += 1
        self._commit(raw)
        if self.capture.terminate_on_success and self.success(info):
            terminated = True
        truncated = bool(truncated) or self.steps >= self.max_steps
        return self.observe(), float(reward), bool(terminated), truncated, info

    def observe(self) -> dict:
        """The boundary observation (copies): `state`, the env's own observation (`observation` for a Box space;
        `observation.<key>[.<key>...]` for each leaf of a Dict space; shapes and dtypes as its space says) and
        `image_<camera>`."""
        obs = {"state": self._np["obs_state"].copy()}
        for key, _, view in self._native_views:
            obs[key] = view.copy()
        for c, img in self._images.items():
            obs[image_key(c)] = img.copy()
        return obs

    def flat_observation(self) -> np.ndarray:
        """The env's boundary observation as one float64 vector (its leaves in the space's key order)."""
        return np.concatenate([view.reshape(-1).astype(np.float64) for _, _, view in self._native_views]
                              or [np.zeros(0)])

    def success(self, info: Mapping[str, Any]) -> bool:
        return bool(self.capture.success(info)) if self.capture.success is not None else False

    def render(self, camera: str) -> np.ndarray:
        """An image of `camera` for the current MjData (the framework's renderer; reads MjData only)."""
        if self._renderer is None:
            self._renderer = OffscreenRenderer(self.model, self.image_size, self.image_size)
        cam = self._mjv_cameras.get(camera) or mjv_camera(self.model, self.capture.cameras[camera], self.task)
        return self._renderer.render(self.data, cam)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        with self._gl_env.turn():  # the suite frees its renderer in its own context
            self.env.close()

# -- helpers ------------------------------------------------------------------------


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype
