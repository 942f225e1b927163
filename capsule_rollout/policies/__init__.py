"""Policies as rollout-protocol components; imports only `capsules` and `models` (shared model code).

What a user needs: the protocol (`RolloutPolicy`, `PolicySpec`), `InferPolicy` (an object with `infer(obs)`,
openpi's shape), `TorchPolicy` (a torch module; `save_torch_policy` / `load_torch_policy` for a checkpoint).
Names load on first use (`__getattr__`, PEP 562): importing the package imports nothing more.
"""

from __future__ import annotations

from capsule_rollout.lazy_exports import lazy_exports

_EXPORTS = {
    "RolloutPolicy": "capsule_rollout.policies.rollout_policy",
    "PolicySpec": "capsule_rollout.policies.rollout_policy",
    "InferPolicy": "capsule_rollout.policies.infer_policy",
    "TorchPolicy": "capsule_rollout.policies.torch_policy",
    "save_torch_policy": "capsule_rollout.policies.torch_policy",
    "load_torch_policy": "capsule_rollout.policies.torch_policy",
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
