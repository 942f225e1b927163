"""Triton backend of `capsules.digest`: one fused launch digests every buffer of a slab.

Each program hashes one block of one buffer's words and writes a partial sum;
partials are then summed per buffer (integer sums: deterministic in any order).
On a GPU this keeps a snapshot's integrity digest on the device: one launch and
one small device-to-host copy, instead of one host round trip per buffer. Runs on
the CPU under `TRITON_INTERPRET=1` (set before this module is imported).

The interpreter runs the kernel as Python and skips the compiler's checks; the
tests also compile it ahead of time for sm_80 and sm_90 targets (no GPU needed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import lru_cache

import torch
import triton
import triton.language as tl

from capsule_rollout.capsules import digest as _ref

BLOCK_WORDS = 1024
# The reference's constants as `tl.constexpr` globals: the Triton compiler refuses
# plain Python ints read from module scope ("Cannot access global variable").
GOLDEN = tl.constexpr(_ref.GOLDEN)
SALT = tl.constexpr(_ref.SALT)
MIX1 = tl.constexpr(_ref.MIX1)
MIX2 = tl.constexpr(_ref.MIX2)
MASK30 = tl.constexpr(_ref.MASK30)
MASK27 = tl.constexpr(_ref.MASK27)
MASK31 = tl.constexpr(_ref.MASK31)

@triton.jit
def _digest_blocks(
    words_ptr,
    abs_start_ptr,
    rel_start_ptr,
    rem_bytes_ptr,
    partial_ptr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    abs0 = tl.load(abs_start_ptr + pid)
    rel0 = tl.load(rel_start_ptr + pid)
    rem0 = tl.load(rem_bytes_ptr + pid)  # bytes of the buffer from this block on
    j = tl.arange(0, BLOCK).to(tl.int64)
    rem = rem0 - j * 8
    live = rem > 0
    w = tl.load(words_ptr + abs0 + j, mask=live, other=0)
    shift = tl.minimum(tl.maximum(rem, 1), 7) * 8
    keep = tl.where(rem >= 8, -1, (tl.full(rem.shape, 1, tl.int64) << shift) - 1)
    w = w & keep
    z = w ^ ((rel0 + j) * GOLDEN + SALT)
    z = (z ^ ((z >> 30) & MASK30)) * MIX1
    z = (z ^ ((z >> 27) & MASK27)) * MIX2
    z = z ^ ((z >> 31) & MASK31)
    z = tl.where(live, z, 0)
    tl.store(partial_ptr + pid, tl.sum(z, axis=0))


@lru_cache(maxsize=256)
def _plan(slots: tuple[tuple[int, int], ...], device: str) -> tuple[torch.Tensor, ...]:
    """Program table for a slab layout: one row per block of BLOCK_WORDS words."""
    abs_start, rel_start, rem_bytes, owner = [], [], [], []
    for b, (offset, nbytes) in enumerate(slots):
        nwords = (nbytes + 7) // 8
        for rel in range(0, nwords, BLOCK_WORDS):
            abs_start.append(offset // 8 + rel)
            rel_start.append(rel)
            rem_bytes.append(nbytes - rel * 8)
            owner.append(b)
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
    return as_tensor(abs_start), as_tensor(rel_start), as_tensor(rem_bytes), as_tensor(owner)


def on_device(device: torch.device):
    """`device` made current for a launch: Triton launches on the current CUDA device, not the tensors'."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def digest_sums(words: torch.Tensor, slots: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Per-slot digest values of `words` (a slab viewed as int64) as an int64 tensor on its device."""
    abs_start, rel_start, rem_bytes, owner = _plan(tuple(slots), str(words.device))
    sums = torch.zeros(len(slots), dtype=torch.int64, device=words.device)
    if owner.numel():
        partial = torch.empty(owner.numel(), dtype=torch.int64, device=words.device)
        with on_device(words.device):
            _digest_blocks[(owner.numel(),)](words, abs_start, rel_start, rem_bytes, partial, BLOCK=BLOCK_WORDS)
        sums.index_add_(0, owner, partial)
    return sums


def digest_words(words: torch.Tensor, slots: Sequence[tuple[int, int]]) -> list[int]:
    """Per-slot digest values of `words` (a slab viewed as int64)."""
    return [int(v) for v in digest_sums(words, slots).tolist()]
