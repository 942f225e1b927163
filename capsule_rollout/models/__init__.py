"""What policies and critics share: encoders, tokenizer, counter-based noise, observation
validation, the graph runner, checkpoints, the training loop. Imports only `capsules`;
`policies/` and `critics/` import it, never each other."""
