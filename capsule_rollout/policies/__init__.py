"""Policies as rollout-protocol components; imports only `capsules` and `models` (shared model code).

What a user needs: the protocol (`RolloutPolicy`, `PolicySpec`), `InferPolicy` (an object with `infer(obs)`,
openpi's shape), `TorchPolicy` (a torch module; `save_torch_policy` / `load_torch_policy` for a checkpoint).
Names load on first use (`__getattr__`, PEP 562): importing the package imports nothing more.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RolloutPolicy": "capsule_rollout.policies.rollout_policy",
    "PolicySpec": "capsule_rollout.policies.rollout_policy",
    "InferPolicy": "capsule_rollout.policies.infer_policy",
    "TorchPolicy": "capsule_rollout.policies.torch_policy",
    "save_torch_policy": "capsule_rollout.policies.torch_policy",
    "load_torch_policy": "capsule_rollout.policies.torch_policy",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
