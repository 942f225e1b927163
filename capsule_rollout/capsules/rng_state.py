"""Mirror generator state into capsule buffers (live RNGs cannot live in arena memory), and set generators' states
by copying their words into their C state (`GeneratorSetter`: a PCG64's 40 bytes, an MT19937 key of numpy's legacy
`RandomState` or of Python's `random.Random`), each layout checked once per process against the generator's own
state API, which is used where it does not hold."""

from __future__ import annotations

import ctypes
import random
import struct
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


def _bitgen_state(bg: Any) -> int:
    """The address of a bit generator's C state: bitgen_t (numpy's C interface, behind the generator's "BitGenerator"
    capsule) starts with a pointer to it."""
    return ctypes.c_void_p.from_address(_capsule_pointer(bg.capsule, b"BitGenerator")).value


def pcg64_addresses(bg: np.random.PCG64) -> tuple[int, int]:
    """Addresses of a PCG64 bit generator's 128-bit state + increment (32 bytes) and of its (has_uint32, uinteger)
    (8 bytes). bitgen_t (numpy's C interface, behind the generator's "BitGenerator" capsule) starts with a pointer to
    the PCG64 state; far cheaper to reach than `bg.ctypes`, which builds ctypes callbacks per generator. The layout
    is checked against `bg.state` on the first generator of the process (`PCG64LayoutError`)."""
    address = _bitgen_state(bg)  # numpy's pcg64_state: a pointer to the PCG64 state, then has_uint32 and uinteger
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


def _mt_key(key: Any, pos: Any) -> bytes | None:
    """An MT19937 key of 624 words and its position as the 2,500 bytes of numpy's `mt19937_state` (and of CPython's
    Mersenne Twister, position first), or None where they are not that."""
    try:
        words = np.asarray(key)
        if words.shape != (624,) or words.dtype.kind not in "iu" or (words.size and (
                int(words.min()) < 0 or int(words.max()) >= 1 << 32)) or type(pos) is not int or not 0 <= pos <= 624:
            return None
    except (TypeError, ValueError):
        return None
    return words.astype("<u4").tobytes() + struct.pack("<i", pos)


def _legacy_offset() -> int | None:
    """Where numpy's `RandomState` keeps its pending Gaussian (`aug_bitgen_t`: a pointer to the generator's bitgen_t,
    then `int has_gauss`, then `double gauss`), found in a scratch instance as the word that points inside the instance
    itself, and checked both ways against `get_state` / `set_state`; None where no word passes."""
    rs = np.random.RandomState(0)
    base, size = id(rs), type(rs).__basicsize__
    words = (ctypes.c_uint64 * (size // 8)).from_address(base)
    for i in range(2, size // 8 - 2):
        if not base <= words[i] < base + size:
            continue
        at = base + 8 * i
        has, gauss = ctypes.c_int.from_address(at + 8), ctypes.c_double.from_address(at + 16)
        ok = True
        for pending, value in ((1, 0.8125), (0, 0.0), (1, -7.5)):
            st = rs.get_state(legacy=False)
            rs.set_state({**st, "has_gauss": pending, "gauss": value})
            ok = ok and has.value == pending and gauss.value == value
        if ok:
            has.value, gauss.value = 1, 3.25
            st = rs.get_state(legacy=False)
            ok = st["has_gauss"] == 1 and st["gauss"] == 3.25 and rs.standard_normal() == 3.25
        if ok and _legacy_key_layout(rs):
            return 8 * i
    return None


def _legacy_key_layout(rs: Any) -> bool:
    """Whether a `RandomState`'s MT19937 key and position lie where its bit generator's bitgen_t state points,
    checked both ways against `get_state`."""
    key = _bitgen_state(rs._bit_generator)
    st = rs.get_state(legacy=False)["state"]
    if ctypes.string_at(key, 2500) != _mt_key(st["key"], st["pos"]):
        return False
    other = np.random.RandomState(1).get_state(legacy=False)
    ctypes.memmove(key, _mt_key(other["state"]["key"], 17), 2500)
    st = rs.get_state(legacy=False)["state"]
    return st["pos"] == 17 and st["key"].tolist() == other["state"]["key"].tolist()


def _python_layout() -> bool:
    """Whether CPython's `random.Random` keeps its position (int) at byte 16 and its 624 words right after, checked
    both ways against `getstate` / `setstate` in scratch instances."""
    r, other = random.Random(0), random.Random(1)
    if type(r).__basicsize__ < 20 + 2496:
        return False
    r.random()
    if ctypes.string_at(id(r) + 16, 2500) != _python_words(r.getstate()[1]):
        return False
    target = other.getstate()
    ctypes.memmove(id(r) + 16, _python_words(target[1]), 2500)
    r.gauss_next = target[2]
    return r.getstate() == target and r.random() == other.random()


class GeneratorSetter:
    """Sets generators' states where a restore sets the same states into the same generators again and again, by
    copying words into their C state: a PCG64 (numpy's `default_rng`, gymnasium's `np_random`: `pcg64_addresses`),
    numpy's legacy `RandomState` (also the global `numpy.random`: its MT19937 key and position, and its pending
    Gaussian) and Python's `random.Random` (also the global `random`: key and position, `gauss_next` set as an
    attribute). A state is turned into bytes once (found again by its object, kept while cached), a generator's
    addresses found once. Numpy's setters read a key from 624 separate ints (from a list: about 2 us, and 25-40 us
    just after an env's step has pushed them out of the CPU's caches); a copy reads 2.5 KB in one piece. Anything else
    (another bit generator, a subclass, a state that is not plainly one of these, a numpy or CPython laid out
    otherwise) goes through `fallback(generator, state)`, the generators' own API."""

    LIMIT = 64

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self._states: dict[int, tuple[Any, Any]] = {}  # id(state) -> (state, what is copied | None)
        self._targets: dict[int, tuple[Any, tuple]] = {}  # id(generator) -> (it, its addresses)
        self._pcg_broken = False
        self._legacy: int | None | bool = False  # False: not looked for yet; None: none found
        self._python: bool | None = None

    def set(self, g: Any, state: Any) -> None:
        t = type(g)
        if t is np.random.Generator:
            g, t = g.bit_generator, type(g.bit_generator)
        if t is np.random.PCG64 and not self._pcg_broken:
            done = self._pcg64(g, state)
        elif t is np.random.RandomState:
            done = self._legacy_state(g, state)
        elif t is random.Random:
            done = self._python_state(g, state)
        else:
            done = False
        if not done:
            self.fallback(g, state)

    def set_globals(self, numpy_state: Any, python_state: Any) -> None:
        """The global `numpy.random` and `random` states."""
        # the instances the modules' own functions are bound to (what `np.random.set_state` and `random.setstate` set)
        if not self._legacy_state(getattr(np.random.set_state, "__self__", None), numpy_state):
            np.random.set_state(numpy_state)
        if not self._python_state(getattr(random.setstate, "__self__", None), python_state):
            random.setstate(python_state)

    def _cached(self, table: dict[int, tuple[Any, Any]], obj: Any, make: Any) -> Any:
        """`make(obj)`, kept in `table` by `obj`'s id with `obj` itself (so the id stays its own while cached)."""
        cached = table.get(id(obj))
        if cached is None or cached[0] is not obj:
            cached = (obj, make(obj))
            if len(table) >= self.LIMIT:
                table.clear()
            table[id(obj)] = cached
        return cached[1]

    def _source(self, state: Any, make: Any) -> Any:
        return self._cached(self._states, state, make)

    def _target(self, g: Any, find: Any) -> Any:
        return self._cached(self._targets, g, find)

    def _pcg64(self, bg: Any, state: Any) -> bool:
        source = self._source(state, lambda st: _buffer(pcg64_bytes(st) if isinstance(st, dict) else None))
        if source is None:
            return False
        try:
            pcg, aux = self._target(bg, pcg64_addresses)
        except PCG64LayoutError:
            self._pcg_broken = True
            return False
        at = ctypes.addressof(source)
        ctypes.memmove(pcg, at, 32)
        ctypes.memmove(aux, at + 32, 8)
        return True

    def _legacy_state(self, rs: Any, state: Any) -> bool:
        if self._legacy is False:
            self._legacy = _legacy_offset()
        offset = self._legacy
        if offset is None or type(rs) is not np.random.RandomState or type(rs._bit_generator) is not np.random.MT19937:
            return False
        source = self._source(state, _legacy_bytes)
        if source is None:
            return False
        key, has, gauss = self._target(rs, lambda r: (_bitgen_state(r._bit_generator), id(r) + offset + 8,
                                                      id(r) + offset + 16))
        at = ctypes.addressof(source)
        ctypes.memmove(key, at, 2500)
        ctypes.memmove(has, at + 2500, 4)
        ctypes.memmove(gauss, at + 2504, 8)
        return True

    def _python_state(self, r: Any, state: Any) -> bool:
        if self._python is None:
            self._python = _python_layout()
        if not self._python or type(r) is not random.Random:
            return False
        source = self._source(state, _python_bytes)
        if source is None:
            return False
        ctypes.memmove(id(r) + 16, source[0], 2500)
        r.gauss_next = source[1]
        return True


def _buffer(raw: bytes | None) -> Any:
    return None if raw is None else ctypes.create_string_buffer(raw, len(raw))


def _legacy_bytes(state: Any) -> Any:
    """A `RandomState` state dict (`get_state(legacy=False)`) as key and position, has_gauss (int) and gauss
    (double), or None."""
    try:
        if state["bit_generator"] != "MT19937":
            return None
        key = _mt_key(state["state"]["key"], state["state"]["pos"])
        has, gauss = state.get("has_gauss", 0), state.get("gauss", 0.0)
        if key is None or has not in (0, 1) or type(gauss) is not float:
            return None
    except (KeyError, TypeError):
        return None
    return _buffer(key + struct.pack("<i", int(has)) + struct.pack("<d", gauss))


def _python_words(internal: Any) -> bytes | None:
    """CPython's Mersenne Twister state (`getstate()[1]`: 624 words, then the position) as its 2,500 bytes in the
    instance (the position first), or None where it is not that."""
    if type(internal) is not tuple or len(internal) != 625:
        return None
    key = _mt_key(list(internal[:624]), internal[624])
    return None if key is None else key[2496:] + key[:2496]


def _python_bytes(state: Any) -> Any:
    """A `random.getstate()` (version 3) as (position and key as a buffer, gauss_next), or None."""
    try:
        version, internal, gauss_next = state
        words = _python_words(internal)
    except (TypeError, ValueError):
        return None
    if version != 3 or words is None or not (gauss_next is None or type(gauss_next) is float):
        return None
    return _buffer(words), gauss_next
