"""Thin entry points and named configs: `python -m experiments.run NAME [--field value ...]`."""
