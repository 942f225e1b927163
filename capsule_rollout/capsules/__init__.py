"""Execution-state capsules: named state buffers, snapshot / restore / fork / time-travel.

Mechanism only: this package copies named buffers and knows nothing of episodes,
robots or Ray. It imports torch, numpy and (optionally) triton and safetensors.
"""

from capsule_rollout.capsules.arena import Arena
from capsule_rollout.capsules.buffer_spec import BufferSpec, Role
from capsule_rollout.capsules.capsule import Capsule, CapsuleMeta, fork, mismatches, restore, snapshot
from capsule_rollout.capsules.capsule_file import (
    USER_KEY,
    capsule_from_bytes,
    capsule_to_bytes,
    load_capsule,
    save_capsule,
)
from capsule_rollout.capsules.capsule_store import CapsuleStore, StoreStats, Tier
from capsule_rollout.capsules.component import BufferComponent, BufferViews, CapsuleComponent, host_arrays
from capsule_rollout.capsules.digest import BackendChoice, digest_backend, digest_slab, digest_tensors
from capsule_rollout.capsules.errors import (
    CapsuleAlignmentError,
    CapsuleError,
    CapsuleFormatError,
    CapsuleIntegrityError,
    CapsuleMismatchError,
    CapsuleNotFoundError,
    CapsuleSignatureError,
    Mismatch,
    SpecError,
    StoreBudgetError,
)
from capsule_rollout.capsules.signing_key import SigningKeyError, key_source, signing_key
from capsule_rollout.capsules.timeline import Timeline
from capsule_rollout.capsules.trust import Trust, add_safe_types
from capsule_rollout.capsules.verify import Steppable, VerifyReport, verify_steppable

__all__ = [
    "USER_KEY",
    "Arena",
    "BackendChoice",
    "BufferComponent",
    "BufferSpec",
    "BufferViews",
    "Capsule",
    "CapsuleAlignmentError",
    "CapsuleComponent",
    "CapsuleError",
    "CapsuleFormatError",
    "CapsuleIntegrityError",
    "CapsuleSignatureError",
    "CapsuleMeta",
    "CapsuleMismatchError",
    "CapsuleNotFoundError",
    "CapsuleStore",
    "Mismatch",
    "Role",
    "SigningKeyError",
    "SpecError",
    "Steppable",
    "StoreBudgetError",
    "StoreStats",
    "Tier",
    "Timeline",
    "Trust",
    "VerifyReport",
    "add_safe_types",
    "capsule_from_bytes",
    "capsule_to_bytes",
    "digest_backend",
    "digest_slab",
    "digest_tensors",
    "fork",
    "host_arrays",
    "key_source",
    "load_capsule",
    "mismatches",
    "restore",
    "save_capsule",
    "signing_key",
    "snapshot",
    "verify_steppable",
]
