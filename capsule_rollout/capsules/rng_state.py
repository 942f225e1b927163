"""Mirror generator state into capsule buffers (live RNGs cannot live in arena memory)."""

from __future__ import annotations

import numpy as np

PCG64_WORDS = 6  # state (lo, hi), increment (lo, hi), has_uint32, uinteger


def pack_pcg64(gen: np.random.Generator, out: np.ndarray) -> None:
    """Write a numpy PCG64 generator's state into `out`, a (6,) uint64 view."""
    st = gen.bit_generator.state
    if st["bit_generator"] != "PCG64":
        raise ValueError(f"only PCG64 generators can be captured, got {st['bit_generator']}")
    mask = (1 << 64) - 1
    s, inc = st["state"]["state"], st["state"]["inc"]
    out[:] = [s & mask, s >> 64, inc & mask, inc >> 64, st["has_uint32"], st["uinteger"]]


def unpack_pcg64(gen: np.random.Generator, words: np.ndarray) -> None:
    """Load a PCG64 state written by `pack_pcg64` into `gen`."""
    w = [int(x) for x in words]
    gen.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": w[0] | (w[1] << 64), "inc": w[2] | (w[3] << 64)},
        "has_uint32": w[4],
        "uinteger": w[5],
    }
