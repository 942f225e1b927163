"""RolloutHost state machine, hand-off channel, branching, policy/critic sources and the Ray layer.

The only package that imports ray; episodes are recorded through `stores/`.
"""
