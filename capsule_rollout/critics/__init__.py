"""Critics as rollout-protocol components; imports only `capsules` and `models` (shared model code).

What a user needs: the protocol (`RolloutCritic`, `CriticSpec`) and `InferCritic` (an object with
`value(obs) -> float`).
Names load on first use (`__getattr__`, PEP 562): importing the package imports nothing more.
"""

from __future__ import annotations

from capsule_rollout.lazy_exports import lazy_exports

_EXPORTS = {
    "RolloutCritic": "capsule_rollout.critics.rollout_critic",
    "CriticSpec": "capsule_rollout.critics.rollout_critic",
    "InferCritic": "capsule_rollout.critics.infer_critic",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
