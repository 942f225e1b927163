"""VLA flow/diffusion policy and its graph runner; imports only `capsules`."""
