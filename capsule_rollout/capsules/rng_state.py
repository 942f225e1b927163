"""Mirror generator state into capsule buffers (live RNGs cannot live in arena memory), and set a PCG64 generator's
state by copying its 40 bytes of C state (`pcg64_addresses`, `PCG64Setter`)."""

from __future__ import annotations

import ctypes
from typing import Any

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


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_LAYOUT_CHECKED = False


class PCG64LayoutError(RuntimeError):
    """This numpy lays out a PCG64 generator's C state otherwise than `pcg64_addresses` reads it."""


def pcg64_addresses(bg: np.random.PCG64) -> tuple[int, int]:
    """Addresses of a PCG64 bit generator's 128-bit state + increment (32 bytes) and of its (has_uint32, uinteger)
    (8 bytes). bitgen_t (numpy's C interface, behind the generator's "BitGenerator" capsule) starts with a pointer to
    the PCG64 state; far cheaper to reach than `bg.ctypes`, which builds ctypes callbacks per generator. The layout
    is checked against `bg.state` on the first generator of the process (`PCG64LayoutError`)."""
    address = ctypes.c_void_p.from_address(_capsule_pointer(bg.capsule, b"BitGenerator")).value
    pcg = ctypes.c_void_p.from_address(address).value
    if not _LAYOUT_CHECKED:  # a property of this numpy build: checked on the first generator only
        _check_layout(bg, pcg, address + 8)
    return pcg, address + 8


def _check_layout(bg: np.random.PCG64, pcg: int, aux: int) -> None:
    global _LAYOUT_CHECKED
    words = np.frombuffer((ctypes.c_char * 32).from_address(pcg), np.uint64)
    flags = np.frombuffer((ctypes.c_char * 8).from_address(aux), np.uint32)
    st = bg.state
    ok = (int(words[0]) | int(words[1]) << 64) == st["state"]["state"] and \
         (int(words[2]) | int(words[3]) << 64) == st["state"]["inc"] and \
         int(flags[0]) == st["has_uint32"] and int(flags[1]) == st["uinteger"]
    _LAYOUT_CHECKED = ok
    if not ok:
        raise PCG64LayoutError(f"this numpy's PCG64 C state layout is not the one copied here (numpy {np.__version__})")


def pcg64_bytes(state: dict) -> bytes | None:
    """A PCG64 state dict (`bit_generator.state`) as the 40 bytes `pcg64_addresses` points at, or None for any other
    state (another bit generator, a value out of range)."""
    try:
        if state["bit_generator"] != "PCG64":
            return None
        words = state["state"]["state"], state["state"]["inc"]
        has, value = state["has_uint32"], state["uinteger"]
        if not all(type(w) is int and 0 <= w < 1 << 128 for w in words) or has not in (0, 1) or \
                not (type(value) is int and 0 <= value < 1 << 32):
            return None
    except (KeyError, TypeError):
        return None
    return b"".join(w.to_bytes(16, "little") for w in words) + int(has).to_bytes(4, "little") + \
        value.to_bytes(4, "little")


class PCG64Setter:
    """Sets generators' states where a restore sets the same states into the same generators again and again: a
    PCG64 generator (numpy's `default_rng`, gymnasium's `np_random`) by copying the state's 40 bytes into its C
    state, both found once (a state by its object, a generator by itself: both kept while cached); any other through
    `fallback(generator, state)`. A numpy whose layout differs (`PCG64LayoutError`) gets the fallback for all."""

    LIMIT = 64

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self._states: dict[int, tuple[Any, Any]] = {}  # id(state) -> (state, its 40 bytes as a ctypes buffer | None)
        self._targets: dict[int, tuple[Any, int, int]] = {}  # id(bit generator) -> (it, state address, aux address)
        self._broken = False

    def set(self, g: Any, state: Any) -> None:
        bg = g.bit_generator if type(g) is np.random.Generator else g
        if type(bg) is not np.random.PCG64 or self._broken:
            return self.fallback(g, state)
        cached = self._states.get(id(state))
        if cached is None or cached[0] is not state:
            raw = pcg64_bytes(state) if isinstance(state, dict) else None
            cached = (state, None if raw is None else ctypes.create_string_buffer(raw, 40))
            if len(self._states) >= self.LIMIT:
                self._states.clear()
            self._states[id(state)] = cached
        source = cached[1]
        if source is None:
            return self.fallback(g, state)
        target = self._targets.get(id(bg))
        if target is None or target[0] is not bg:
            try:
                target = (bg, *pcg64_addresses(bg))
            except PCG64LayoutError:
                self._broken = True
                return self.fallback(g, state)
            if len(self._targets) >= self.LIMIT:
                self._targets.clear()
            self._targets[id(bg)] = target
        at = ctypes.addressof(source)
        ctypes.memmove(target[1], at, 32)
        ctypes.memmove(target[2], at + 32, 8)
        return None
