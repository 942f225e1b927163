"""RolloutHost state machine, hand-off channel, episode recorders and the Ray layer.

The only package that imports ray.
"""
