"""The state reader's figures for BENCHMARKS "Reliability": each attack stream's size, the peak tracemalloc saw, the
reader's bound (64 bytes per byte + 1 MiB), the outcome and the CPU time.

    python -m tests.reliability.reader_bounds

Run with another tree first on `PYTHONPATH` to measure it the same way (the "before" figures).
"""

from __future__ import annotations

import time
import tracemalloc

from capsule_rollout.capsules import state_codec as sc


class _Everything:
    def lookup(self, module, qualname, purpose):
        return sc.loaded(module, qualname)


def _str(s: str) -> bytes:
    b = s.encode()
    return sc._varint(len(b)) + b


def _copies(first: bytes, copy: bytes, n: int) -> bytes:
    return sc.MAGIC + bytes([sc.LIST]) + sc._varint(n + 1) + first + copy * n


def streams() -> dict[str, bytes]:
    fields = bytes([sc.LIST]) + sc._varint(2000) + b"".join(
        bytes([sc.TUPLE, 2, sc.STR]) + _str(f"f{i}") + bytes([sc.STR]) + _str("<f8") for i in range(2000))
    p = (1 << 61) - 1
    return {"dtype copies of a back reference": _copies(fields, bytes([sc.DTYPE, sc.MEMO, 1]), 400),
            "object array claiming 2**25 items": sc.MAGIC + bytes([sc.OBJECT_ARRAY, 1]) + sc._varint(1 << 25)
            + bytes([1, sc.LIST, 0]),
            "20,000 integer keys sharing a hash": sc.encode({i * p: 0 for i in range(1, 20001)})}


def main() -> None:
    for name, stream in streams().items():
        tracemalloc.start()
        t = time.process_time()
        try:
            sc.decode(stream, _Everything())
            outcome = "read"
        except Exception as exc:  # noqa: BLE001 - what a reader raises is the figure
            outcome = f"{type(exc).__name__}"
        cpu = time.process_time() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        bound = sc.MEMORY_PER_BYTE * len(stream) + (1 << 20)
        print(f"{name}: {len(stream):,} bytes, peak {peak / 2**20:.2f} MiB, bound {bound / 2**20:.2f} MiB, "
              f"{outcome}, {cpu:.3f} s of CPU")


if __name__ == "__main__":
    sc.decode(sc.encode(0), _Everything())  # the reader loaded before anything is traced
    main()
