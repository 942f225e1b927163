"""The learning layer, between `rollout/` and `cli/`: what training, evaluation and the RECAP
loop are made of, as library functions (the commands, `cli`, keep the command lines, printing and file naming).

- `policy_data`: a store's episodes as training arrays, action labels, episode actors
- `evaluation`: play seeds through the one rollout loop and summarise them (`evaluate_policy`, `play`)
- `advantage_labels`: critic values over a store, and the advantage sidecar format beside it
- `stats`: Wilson intervals, failure AUC, paired (McNemar) comparisons, per-phase breakdowns
"""
