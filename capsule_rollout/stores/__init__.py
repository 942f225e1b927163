"""Recorded episodes and their stores: the episode schema and `Episode`, the zarr / npz recorders and readers,
the sharded store and its manifest, consolidation, the LeRobot v3.0 format, the single-store writer lock.

Imports no other layer (numpy, zarr, pyarrow only): a store can be read without the rollout machinery.
"""
