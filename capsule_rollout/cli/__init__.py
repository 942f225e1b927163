"""Thin entry points: `python -m capsule_rollout NAME [--field value ...]`; the named configs are in `commands/`."""
