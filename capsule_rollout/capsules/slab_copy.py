"""Copying capsule slabs into arena slabs, each pair by the cheapest call that does it.

A restore is one copy per state slab. Each slab's place is found once (`slab_places`: contiguous
host memory, contiguous memory of one CUDA device, or neither): a pair of host slabs is copied
by one `memmove` (torch's `copy_` costs microseconds of dispatch per call, a third of a small
env's whole restore), every other pair by torch's `copy_` on the current stream, so an arena with
its env on the host and its policy on a GPU pays the dispatch only for the device slab. (Calling
the CUDA driver's `cuMemcpyDtoDAsync` directly for device pairs was measured on an H200 host and
saved nothing: 6.3-6.7 us of host time per restore copy against torch's 5.6-6.1 us.)
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

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


def copy_slabs(
    dst_places: Sequence[SlabPlace], src_places: Sequence[SlabPlace],
    dst_slabs: Sequence[tuple[SlabLayout, torch.Tensor]], src_slabs: Sequence[tuple[SlabLayout, torch.Tensor]],
) -> None:
    """Copy each source slab into its destination slab (sizes already compared by the caller)."""
    for i, (dst_addr, nbytes, dst_place) in enumerate(dst_places):
        src_addr, _, src_place = src_places[i]
        if dst_place == HOST and src_place == HOST:
            ctypes.memmove(dst_addr, src_addr, nbytes)
        else:
            dst, src = dst_slabs[i][1], src_slabs[i][1]  # pinned host to device: asynchronous
            dst.copy_(src, non_blocking=src_place == HOST and dst.is_cuda and src.is_pinned())
