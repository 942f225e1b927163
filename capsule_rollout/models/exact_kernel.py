"""The exact linear layer as one compiled CPU operator (`exact_kernel.cpp`), for products of few rows.

At one row, `exact_sums.exact_linear`'s nine tensor operations cost three times its products: the shipped policy's
traced act at one row took 6.3 ms with them and 4.1 ms with this operator, the network as is 4.2 (measured), the same
bits by construction (every partial sum exact: see the source). With AVX2 or AVX-512 its products run in blocks of
rows held in registers: a 256x256 layer of 8 rows in 24 us against 103 us for the Python path and 28 us for the
float32 layer as is (measured, one thread). `exact_linear` calls it for a float32 CPU input of the rows it `serves`
when it is built.

It is built once per machine and torch, ahead of any run (`python -m capsule_rollout.models.exact_kernel`, which
`make install` runs: about 40 s against torch's headers), into `~/.cache/capsule_rollout/kernels/<key>` (the key: the
source, the flags and torch's version, so another venv's torch never loads a library built against other headers).
A run only loads it: where it was not built (no compiler, no `ninja`), every layer takes `exact_linear`'s Python
path, which gives the same bits. `CAPSULE_ROLLOUT_EXACT_KERNEL=0` leaves it unloaded (for comparisons).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("exact_kernel.cpp")
FLAGS = ("-O3", "-ffp-contract=off")
"""`-ffp-contract=off`: the rounding's addition and subtraction stay two roundings (no fused multiply-add); no
`-march`: the library serves every x86-64 CPU it is built on or copied to."""
VECTOR_ROWS, NARROW_COLUMNS, BASELINE_ROWS = 64, 8, 4
"""Which products the operator serves. With its AVX2 or AVX-512 kernel: up to 64 rows (a 256x256 layer, one thread:
104 us at 32 rows against 283 for the Python path, whose float64 product the library runs on more threads for larger
batches), and any number of rows for a product of at most 8 columns, whose weights stay in the cache (the tabletop
policy's keypoints, 512 rows of 256 by 2: 69 us against 320). With only its baseline loop (a CPU without AVX2, or
not x86): up to 4 rows (at 4 rows 85 against 86 us, at 8 166 against 103, measured with the baseline forced)."""
_loaded: bool | None = None


@functools.cache
def _key() -> str:
    """The source, the flags, torch's and Python's versions, hashed once per process."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + torch.__version__.encode()
                            + sys.version.encode()).hexdigest()
    return digest[:16]


def build_directory() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "capsule_rollout" / "kernels" / _key()


def _library() -> Path:
    return build_directory() / f"capsule_rollout_exact_{_key()}.so"


def available() -> bool:
    """Whether the operator is loaded (`torch.ops.capsule_rollout.exact_linear`): loaded at the first call when it was
    built; never built here (a run does not wait 40 s for a compiler)."""
    global _loaded
    if _loaded is None:
        _loaded = False
        if os.environ.get("CAPSULE_ROLLOUT_EXACT_KERNEL", "1") != "0" and _library().is_file():
            try:
                torch.ops.load_library(str(_library()))
                _loaded = True
            except (OSError, RuntimeError):  # a library this torch cannot load: the Python path serves
                _loaded = False
    return _loaded


def kernels() -> list[int]:
    """The operator's kernels this CPU runs (its `isa` argument: 0 baseline, 1 AVX2, 2 AVX-512); none where it is
    not loaded."""
    return list(_kernels(available()))


@functools.cache
def _kernels(loaded: bool) -> tuple[int, ...]:
    if not loaded:
        return ()
    read = ctypes.CDLL(str(_library())).capsule_rollout_exact_kernels
    read.restype = ctypes.c_int64
    mask = read()
    return tuple(isa for isa in range(3) if mask >> isa & 1)


def most_rows() -> int:
    """Rows up to which the operator serves a product of any width: 0 where it is not loaded."""
    found = _kernels(available())
    return 0 if not found else VECTOR_ROWS if max(found) > 0 else BASELINE_ROWS


def serves(rows: int, columns: int) -> bool:
    """Whether `exact_sums.exact_linear` calls the operator for a product of `rows` rows and `columns` columns."""
    most = most_rows()
    return rows <= most or (most == VECTOR_ROWS and columns <= NARROW_COLUMNS)


def build() -> Path:
    """Compile the operator into `build_directory()` (torch's extension builder: a C++ compiler and `ninja`)."""
    from torch.utils.cpp_extension import load

    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    load(name=f"capsule_rollout_exact_{_key()}", sources=[str(SOURCE)], extra_cflags=list(FLAGS),
         build_directory=str(directory), is_python_module=False, verbose=False)
    return _library()


def main() -> int:
    """Build the operator; where it cannot be built, say why and exit 0 (the Python path gives the same bits)."""
    if _library().is_file():
        print(f"exact_kernel: built at {_library()}")
        return 0
    try:
        path = build()
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, headers missing: the Python path serves
        last = str(exc).strip().splitlines()[-1:] or [""]
        print(f"exact_kernel: not built ({type(exc).__name__}: {last[0]}); exact sums run their Python path (the same "
              "bits, slower at one row)")
        return 0
    print(f"exact_kernel: built at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
