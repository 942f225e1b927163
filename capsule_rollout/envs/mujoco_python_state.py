"""The Python half of `envs.mujoco_capsule.MujocoCapsuleEnv`'s capsule (a mixin): the env's Python object graph
captured with nothing declared (`_snapshot_graph` into the slab, `_prepared_graph` read back and resolved before a
restore) and the boundary observation the env returned, kept once in its own dtypes (`_commit`; a wrapper's copy
of it written as a reference: `_natives_in`)."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from capsule_rollout.envs.mujoco_capture import MujocoCapsuleError, flatten, slab_overflow
from capsule_rollout.envs.object_graph import GraphStateError


class MujocoPythonState:
    """`MujocoCapsuleEnv`'s Python state and boundary observation (its attributes are the adapter's)."""

    def _prepared_graph(self) -> Any:
        """The capsule's Python state read and resolved in the env (by check_restore, when restored through
        the arena). A renderer the capsule's env had made and this one has not yet (a viewer made at the first
        render: a fresh process) is made by one render of the env's own, before MjData is restored, so that
        the capsule's camera and options are set in it rather than the ones it would pick at its first render."""
        n = int(self._np["python_len"][0])
        blob = self._np["python"][:n].tobytes()
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared[0] != blob:  # restored without check_restore (not through the arena)
            prepared = (blob, self._graph.prepare(blob, self._natives_in(self._np)))
        missing = set(prepared[1].missing_structs) - self._unrendered
        if missing:
            try:
                with self._gl_env.turn():
                    self.unwrapped.render()
            except Exception:  # noqa: BLE001 - a suite that cannot render now keeps the renderer it makes later
                pass
            prepared = (blob, self._graph.prepare(blob, self._natives_in(self._np)))
            self._unrendered |= missing & set(prepared[1].missing_structs)  # not made by a render: not tried again
        return prepared[1]

    def _snapshot_graph(self, b: dict[str, np.ndarray]) -> None:
        for src, dst, n in self._model_copies:
            ctypes.memmove(src, dst, n)
        # was MjData left by mj_step1 (dm_control steps mj_step2 first, reading what mj_step1 left in the
        # arena, which a capsule does not hold)? mj_step1 on a copy changes nothing in the buffer then
        scratch = self._scratch
        ctypes.memmove(self._scratch_ptr, self._buffer_ptr, self._buffer_bytes)
        scratch.time = self.data.time
        mujoco.mj_step1(self.model, scratch)
        b["physics_flags"][0] = int(np.array_equal(self._scratch_view, b["mjdata"]))
        kept = {id(leaf): (key, leaf) for key, leaf, view in getattr(self, "_raw_leaves", ())
                if leaf.shape == view.shape and leaf.dtype == view.dtype and np.array_equal(leaf, view)}
        try:
            blob = self._graph.snapshot(externals=kept)
        except GraphStateError as exc:
            raise MujocoCapsuleError(f"{self.capture.task}: {exc}") from None
        if len(blob) > self._python_bytes:
            raise slab_overflow(self.capture.task, self.env, len(blob), self._python_bytes)
        b["python"][: len(blob)] = np.frombuffer(blob, np.uint8)
        b["python"][len(blob):] = 0  # a capsule's bytes are a function of the state alone
        b["python_len"][0] = len(blob)

    def _state(self, raw_obs: Any, flat: np.ndarray) -> np.ndarray:
        fn = self.capture.state
        return np.asarray(fn(flat if raw_obs is None else raw_obs) if fn is not None else flat, np.float32)

    def _kept(self, raw: Any) -> Any:
        keys = self.capture.observation_keys
        return raw if keys is None or not isinstance(raw, Mapping) else {k: raw[k] for k in keys}

    def _natives_in(self, buffers: Mapping[str, Any]) -> Any:
        """The boundary observation's leaves in `buffers` (numpy arrays: a capsule's, or the arena's), by key: what a
        snapshot wrote by key instead of a second copy (a wrapper keeping the last observation)."""
        index = {key: i for i, (key, _, _, _) in enumerate(self._natives)}

        def leaf(key: str) -> np.ndarray:
            return np.array(buffers[f"obs_native_{index[key]}"])  # a copy: the env's own array from now on
        return leaf

    def _kept_space(self) -> Any:
        space = getattr(self.env, "observation_space", None)
        keys = self.capture.observation_keys
        if keys is None or not isinstance(space, gym.spaces.Dict):
            return space
        return gym.spaces.Dict({k: space.spaces[k] for k in keys})

    def _commit(self, raw: Any) -> None:
        b = self._np
        flat = flatten(self._kept(raw))
        if flat.shape[0] != self._obs_dim:
            parts = ", ".join(f"{k} {np.shape(v)}" for k, v in raw.items()) if isinstance(raw, Mapping) else \
                str(np.shape(raw))
            raise MujocoCapsuleError(
                f"{self.capture.task} returned an observation of {flat.shape[0]:,} values ({parts}) where its "
                f"observation_space says {self._obs_dim:,}: the env does not honour its own space (an image "
                "rendered at a fixed size whatever its size options say?); make the env with options it honours")
        kept = self._kept(raw)
        self._raw_leaves = []
        for key, path, view in self._native_views:
            leaf = kept
            for k in path:
                leaf = leaf[k]
            view[...] = np.asarray(leaf).reshape(view.shape)
            if isinstance(leaf, np.ndarray):  # a wrapper may keep this very array: the capsule holds it once
                self._raw_leaves.append((key, leaf, view))
        b["obs_state"][:] = self._state(raw, flat)
        for c, img in self._images.items():
            img[...] = self.render(c)
