"""Thin entry points: `python -m experiments.run NAME [--field value ...]`; the named configs are in `commands/`."""
