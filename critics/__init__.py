"""Distributional value critic; imports only `capsules` (and a small shared-encoder module)."""
