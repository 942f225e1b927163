"""VLA flow/diffusion policy and its runtime; imports only `capsules` and `models` (shared model code)."""
