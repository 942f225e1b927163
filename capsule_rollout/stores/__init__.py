"""Recorded episodes and their stores: the episode schema and `Episode`, the zarr / npz recorders and readers,
the sharded store and its manifest, consolidation, the LeRobot v3.0 format, the single-store writer lock.

Imports no other layer (numpy, zarr, pyarrow only): a store can be read without the rollout machinery.

What a user needs: `open_episode_reader` (any store: `Episode`, `EpisodeMeta`), `read_env_description` (what
the env said of itself: `EnvDescription`), `ZarrRecorder`, `export_lerobot`.
Names load on first use (`__getattr__`, PEP 562): importing the package imports nothing more.
"""

from __future__ import annotations

from capsule_rollout.lazy_exports import lazy_exports

_EXPORTS = {
    "open_episode_reader": "capsule_rollout.stores.sharded_reader",
    "Episode": "capsule_rollout.stores.episode",
    "EpisodeMeta": "capsule_rollout.stores.episode",
    "EnvDescription": "capsule_rollout.stores.env_description",
    "read_env_description": "capsule_rollout.stores.env_description",
    "ZarrRecorder": "capsule_rollout.stores.zarr_recorder",
    "export_lerobot": "capsule_rollout.stores.lerobot_writer",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
