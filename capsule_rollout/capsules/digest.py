"""Per-buffer 64-bit digests of slab regions, with an automatic backend choice.

The digest of a buffer is `sum_i mix(w_i, i) mod 2**64` over its bytes read as
little-endian 64-bit words `w_i` (the last word zero-padded), where `i` is the word
index inside the buffer and `mix` is the splitmix64 finaliser. A sum of mixed
words is order-free, so any blocking (one Triton program per block on a GPU,
vectorised chunks on the CPU) gives the same bits, and the digest does not depend
on where the buffer sits in a slab.

Backends: `triton` (one fused launch over every buffer of a slab; used for CUDA
slabs once a first small launch on the device has worked) and `torch` (the
reference, used on the CPU and as the fallback). `CAPSULES_DIGEST_BACKEND`
= auto | torch | triton overrides the choice; `digest_backend(device)` says
which one serves a device and why. It is an integrity check against
corruption and accidental writes, not a cryptographic MAC.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from capsule_rollout.capsules.layout import SLAB_ALIGN, _round_up

# splitmix64 constants, written as signed int64 (torch and Triton share them).
GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
SALT = 0x2545F4914F6CDD1D
MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
MIX2 = -7723592293110705685  # 0x94D049BB133111EB
# Arithmetic right shifts masked to behave as logical shifts.
MASK30 = (1 << 34) - 1
MASK27 = (1 << 37) - 1
MASK31 = (1 << 33) - 1

_CHUNK_WORDS = 1 << 15  # words per vectorised torch step: 256 KiB stays in cache
_SMALL_WORDS = 1 << 12  # buffers up to this many words are gathered together
BACKENDS = ("auto", "torch", "triton")
ENV_VAR = "CAPSULES_DIGEST_BACKEND"


def mix_words(words: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """splitmix64(words ^ (index * GOLDEN + SALT)) on int64 tensors (wrapping)."""
    z = words ^ (index * GOLDEN + SALT)
    z = (z ^ ((z >> 30) & MASK30)) * MIX1
    z = (z ^ ((z >> 27) & MASK27)) * MIX2
    return z ^ ((z >> 31) & MASK31)


def format_digest(value: int) -> str:
    return f"{value & 0xFFFFFFFFFFFFFFFF:016x}"


def _tail_mask(nbytes: int) -> int:
    """Mask keeping the valid low bytes of a buffer's last word (as int64)."""
    rem = nbytes % 8
    if rem == 0:
        return -1
    return (1 << (8 * rem)) - 1


@dataclass(frozen=True)
class _Batch:
    """Words digested in one vectorised step.

    Either one contiguous run of one buffer (`absidx is None`), or several small
    buffers gathered together.
    """

    abs0: int  # slice start (contiguous run only)
    rel0: int
    n: int
    owner: int  # slot index (contiguous run only)
    absidx: torch.Tensor | None = None  # (n,) int64 word positions in the slab
    base: torch.Tensor | None = None  # (n,) int64: rel * GOLDEN + SALT
    owners: torch.Tensor | None = None  # (n,) int64 slot index per word
    tails: tuple[tuple[int, int], ...] = ()  # (position in batch, mask) of partial last words


@lru_cache(maxsize=512)
def _torch_plan(slots: tuple[tuple[int, int], ...], device: str) -> tuple[_Batch, ...]:
    """Split a slab layout into batches of at most _CHUNK_WORDS words."""
    batches: list[_Batch] = []
    small: list[tuple[int, int, int]] = []  # (slot, abs word, n words)

    def flush_small() -> None:
        if not small:
            return
        absidx, base, owners, tails, pos = [], [], [], [], 0
        for b, abs0, n in small:
            absidx.append(torch.arange(abs0, abs0 + n, dtype=torch.int64))
            base.append(torch.arange(n, dtype=torch.int64) * GOLDEN + SALT)
            owners.append(torch.full((n,), b, dtype=torch.int64))
            if _tail_mask(slots[b][1]) != -1:
                tails.append((pos + n - 1, _tail_mask(slots[b][1])))
            pos += n
        batches.append(
            _Batch(0, 0, pos, -1, torch.cat(absidx).to(device), torch.cat(base).to(device),
                   torch.cat(owners).to(device), tuple(tails))
        )
        small.clear()

    small_words = 0
    for b, (offset, nbytes) in enumerate(slots):
        nwords = (nbytes + 7) // 8
        if nwords == 0:
            continue
        if nwords <= _SMALL_WORDS:
            if small_words + nwords > _CHUNK_WORDS:
                flush_small()
                small_words = 0
            small.append((b, offset // 8, nwords))
            small_words += nwords
            continue
        for rel0 in range(0, nwords, _CHUNK_WORDS):
            n = min(_CHUNK_WORDS, nwords - rel0)
            last = rel0 + n == nwords and _tail_mask(nbytes) != -1
            tails = ((n - 1, _tail_mask(nbytes)),) if last else ()
            batches.append(_Batch(offset // 8 + rel0, rel0, n, b, tails=tails))
    flush_small()
    return tuple(batches)


def _mix_inplace(z: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """`mix_words` finish, in place on z = words ^ base (fewer temporaries)."""
    torch.bitwise_right_shift(z, 30, out=tmp)
    z.bitwise_xor_(tmp.bitwise_and_(MASK30)).mul_(MIX1)
    torch.bitwise_right_shift(z, 27, out=tmp)
    z.bitwise_xor_(tmp.bitwise_and_(MASK27)).mul_(MIX2)
    torch.bitwise_right_shift(z, 31, out=tmp)
    return z.bitwise_xor_(tmp.bitwise_and_(MASK31))


def _digest_torch(words: torch.Tensor, slots: Sequence[tuple[int, int]]) -> list[int]:
    """Reference backend. `words`: the slab as int64; slots: (byte offset, nbytes)."""
    device = words.device
    sums = torch.zeros(len(slots), dtype=torch.int64, device=device)
    ramp = _ramp(str(device))
    for batch in _torch_plan(tuple(slots), str(device)):
        if batch.absidx is None:
            w = words[batch.abs0 : batch.abs0 + batch.n]
            z = ramp[: batch.n] + batch.rel0
            z.mul_(GOLDEN).add_(SALT)
        else:
            w = words[batch.absidx]
            z = batch.base.clone()
        if batch.tails:
            w = w.clone() if batch.absidx is None else w
            for pos, mask in batch.tails:
                w[pos] &= mask
        _mix_inplace(z.bitwise_xor_(w), torch.empty_like(z))
        if batch.absidx is None:
            sums[batch.owner] += z.sum()
        else:
            sums.index_add_(0, batch.owners, z)
    return [int(v) for v in sums.tolist()]


@lru_cache(maxsize=8)
def _ramp(device: str) -> torch.Tensor:
    return torch.arange(_CHUNK_WORDS, dtype=torch.int64, device=device)


def _check_slab(slab: torch.Tensor, slots: Sequence[tuple[int, int]]) -> None:
    if slab.dtype is not torch.uint8 or slab.dim() != 1 or not slab.is_contiguous():
        raise ValueError("digest_slab needs a contiguous 1-D uint8 slab")
    if slab.numel() % 8 or slab.storage_offset() % 8:
        raise ValueError("a slab's length and offset must be multiples of 8 bytes")
    for offset, nbytes in slots:
        if offset % 8 or offset < 0 or offset + nbytes > slab.numel():
            raise ValueError(f"slot (offset {offset}, {nbytes} bytes) is not an 8-aligned region of the slab")


@lru_cache(maxsize=1)
def _triton_import() -> tuple[object | None, str]:
    """(the Triton backend module or None, why not)."""
    try:
        from capsule_rollout.capsules import digest_triton
    except Exception as exc:  # triton missing or broken: the torch backend serves
        return None, f"triton cannot be imported ({type(exc).__name__}: {_first_line(exc)})"
    return digest_triton, ""


def _triton_module():
    return _triton_import()[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"


def triton_available() -> bool:
    """Triton imports. Whether it can launch on a device is `triton_status(device)`."""
    return _triton_module() is not None


@dataclass(frozen=True)
class BackendChoice:
    """The digest backend used for one device, and why."""

    backend: str  # "torch" or "triton"
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"backend": self.backend, "reason": self.reason}


_PROBE_SIZES = (1, 13, 8 * 1024 + 5)  # a partial word, a small buffer, one over a block


@lru_cache(maxsize=16)
def _triton_status(device: str) -> tuple[bool, str]:
    module, why = _triton_import()
    if module is None:
        return False, why
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in _PROBE_SIZES]
    try:
        # a real launch: the first one builds Triton's C launcher (a C compiler and the
        # Python headers) and compiles the kernel for the device; either can fail
        slab, slots = pack([t.to(device) for t in tensors])
        got = module.digest_words(slab.view(torch.int64), slots)
    except Exception as exc:
        return False, f"a first Triton launch on {device} failed ({type(exc).__name__}: {_first_line(exc)})"
    want = _digest_torch(slab.view(torch.int64), slots)
    if got != want:
        return False, f"the Triton digest on {device} differs from the torch reference"
    return True, f"a Triton launch on {device} gave the reference digest"


def triton_status(device: torch.device | str) -> tuple[bool, str]:
    """Whether the Triton digest works on `device` (one small real launch, checked against torch; cached)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _triton_status(str(device))


_warned: set[str] = set()


def digest_backend(device: torch.device | str, requested: str | None = None) -> BackendChoice:
    """Resolve `requested` (or $CAPSULES_DIGEST_BACKEND, default auto) for a device, with the reason.

    auto: Triton for CUDA buffers when a first launch on that device works (checked
    once per device), else the torch digest (with a warning saying why); the torch
    digest for CPU buffers. An explicit `triton` that cannot launch raises.
    """
    device = torch.device(device)
    source = "requested" if requested else f"{ENV_VAR}={os.environ[ENV_VAR]}" if os.environ.get(ENV_VAR) else ""
    choice = requested or os.environ.get(ENV_VAR, "auto") or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"digest backend {choice!r} is unknown; use one of {BACKENDS} (argument or ${ENV_VAR})")
    if choice == "torch":
        return BackendChoice("torch", f"torch digest {source}")
    if choice == "auto" and device.type != "cuda":
        return BackendChoice("torch", f"the torch digest serves {device.type} buffers")
    usable, why = triton_status(device)
    if choice == "triton" and not usable:
        raise RuntimeError(f"digest backend 'triton' was {source} but {why}; use 'auto' or 'torch'")
    if usable:
        return BackendChoice("triton", why)
    if str(device) not in _warned:
        _warned.add(str(device))
        warnings.warn(f"capsule digests on {device} fall back to the torch digest: {why}", RuntimeWarning,
                      stacklevel=2)
    return BackendChoice("torch", f"fallback: {why}")


def choose_backend(device: torch.device, requested: str | None = None) -> str:
    """The backend name `digest_backend` resolves to."""
    return digest_backend(device, requested).backend


def digest_slab(
    slab: torch.Tensor, slots: Sequence[tuple[int, int]], *, backend: str | None = None
) -> list[str]:
    """Digest each (byte offset, nbytes) region of `slab`; one hex string per slot."""
    _check_slab(slab, slots)
    if not slots:
        return []
    words = slab.view(torch.int64)
    if digest_backend(slab.device, backend).backend == "triton":
        values = _triton_module().digest_words(words, tuple(slots))
    else:
        values = _digest_torch(words, slots)
    return [format_digest(v) for v in values]


def pack(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Copy tensors (one device) into a fresh slab at 64-byte offsets."""
    slots, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        slots.append((offset, nbytes))
        offset = _round_up(offset + nbytes, SLAB_ALIGN)
    device = tensors[0].device if tensors else torch.device("cpu")
    slab = torch.zeros(offset, dtype=torch.uint8, device=device)
    for t, (off, nbytes) in zip(tensors, slots):
        slab[off : off + nbytes].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return slab, slots


def digest_tensors(tensors: Sequence[torch.Tensor], *, backend: str | None = None) -> list[str]:
    """Digests of standalone tensors (same values as if they sat in an arena slab)."""
    if not tensors:
        return []
    slab, slots = pack(tensors)
    return digest_slab(slab, slots, backend=backend)
