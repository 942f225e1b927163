"""Distributional value critic; imports only `capsules` and `models` (shared model code)."""
