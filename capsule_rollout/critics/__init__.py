"""Critics as rollout-protocol components; imports only `capsules` and `models` (shared model code).

What a user needs: the protocol (`RolloutCritic`, `CriticSpec`) and `InferCritic` (an object with
`value(obs) -> float`).
Names load on first use (`__getattr__`, PEP 562): importing the package imports nothing more.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RolloutCritic": "capsule_rollout.critics.rollout_critic",
    "CriticSpec": "capsule_rollout.critics.rollout_critic",
    "InferCritic": "capsule_rollout.critics.infer_critic",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
