"""Copying capsule slabs into arena slabs, each pair by the cheapest call that does it.

A restore is one copy per state slab. Each slab's place is found once (`slab_places`: contiguous
host memory, contiguous memory of one CUDA device, or neither): a pair of host slabs is copied
by one `memmove` (torch's `copy_` costs microseconds of dispatch per call, a third of a small
env's whole restore), every other pair by torch's `copy_` on the current stream, so an arena with
its env on the host and its policy on a GPU pays the dispatch only for the device slab. (Calling
the CUDA driver's `cuMemcpyDtoDAsync` directly for device pairs was measured on an H200 host and
saved nothing: 6.3-6.7 us of host time per restore copy against torch's 5.6-6.1 us.)

A host slab holding buffers a component copies from the capsule itself (`direct_buffers`: a MuJoCo env's MjData
image goes straight into MjData) is copied around them, in the runs between (`copy_runs`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Collection, Sequence

import torch

from capsule_rollout.capsules.layout import SlabLayout

HOST = -1
"""The place of a contiguous host slab; a CUDA slab's place is its device index."""

SlabPlace = tuple[int, int, int | None]
"""(address, bytes, place) of one slab; place None: neither contiguous host nor contiguous CUDA memory."""


def slab_places(slabs: Sequence[tuple[SlabLayout, torch.Tensor]]) -> tuple[SlabPlace, ...]:
    """Where each slab lives (found once: slabs never move)."""
    out = []
    for _, t in slabs:
        place = None
        if t.is_contiguous():
            if t.is_cpu:
                place = HOST
            elif t.is_cuda:
                place = t.device.index  # a CUDA tensor's device always has its index
        out.append((t.data_ptr(), t.nbytes, place))
    return tuple(out)


Run = tuple[int, int]
"""(offset, bytes) of a part of a slab a restore copies."""


def copy_runs(layout: SlabLayout, skipped: Collection[str]) -> tuple[Run, ...]:
    """The runs of `layout`'s slab a restore copies: the whole slab, less the slots named in `skipped`
    ("<component>/<buffer>", copied by their component), the padding between the others kept with them."""
    runs: list[Run] = []
    start = 0
    for slot in layout.slots:
        if slot.key in skipped:
            if slot.offset > start:
                runs.append((start, slot.offset - start))
            start = slot.offset + slot.nbytes
    if layout.nbytes > start:
        runs.append((start, layout.nbytes - start))
    return tuple(runs)


def copy_slabs(
    dst_places: Sequence[SlabPlace], src_places: Sequence[SlabPlace],
    dst_slabs: Sequence[tuple[SlabLayout, torch.Tensor]], src_slabs: Sequence[tuple[SlabLayout, torch.Tensor]],
    runs: Sequence[tuple[Run, ...] | None] = (),
) -> None:
    """Copy each source slab into its destination slab (sizes already compared by the caller); a host pair with
    `runs[i]` (not None) only in those runs."""
    for i, (dst_addr, nbytes, dst_place) in enumerate(dst_places):
        src_addr, _, src_place = src_places[i]
        if dst_place == HOST and src_place == HOST:
            parts = runs[i] if i < len(runs) else None
            if parts is None:
                ctypes.memmove(dst_addr, src_addr, nbytes)
            else:
                for offset, n in parts:
                    ctypes.memmove(dst_addr + offset, src_addr + offset, n)
        else:
            dst, src = dst_slabs[i][1], src_slabs[i][1]  # pinned host to device: asynchronous
            dst.copy_(src, non_blocking=src_place == HOST and dst.is_cuda and src.is_pinned())
