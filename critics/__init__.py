"""Distributional value critic; imports only `capsules` and `policies.common` (shared encoders)."""
