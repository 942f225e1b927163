"""Pieces the policy and the critic share: tokenizer, encoders, normalisation, noise,
checkpoints and the training loop. `critics/` may import this sub-package only."""
