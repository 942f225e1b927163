"""A coverage-guided fuzzer (atheris, libFuzzer) of the capsule state reader: every input is decoded as a capsule's
Python state would be, by the names an env's graph allows (`capsules.graph.names.GraphNamespace` of a MuJoCo env
with Python state of its own), and must either read or fail with `StateDecodeError`; what reading allocates must
stay under the reader's bound (`MEMORY_PER_BYTE` x the input + 1 MiB, traced by tracemalloc).

    python -m tests.reliability.fuzz_state_reader -runs=200000 -max_total_time=3600 [CORPUS_DIR]

libFuzzer's options as it takes them. The corpus starts from real snapshots (an env's three parts) and the codec's
own encodings of assorted values. Every 2,000 inputs one JSON line: inputs tried, how many read,
how many were refused, the largest peak over its bound's share, the seconds taken; libFuzzer prints the coverage
(`cov:` edges, `ft:` features). Any other exception, an allocation past the bound, or a signal stops the run with
libFuzzer's crash report (the input saved as `crash-*`).
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc

import atheris

with atheris.instrument_imports(include=["capsule_rollout.capsules"]):
    from capsule_rollout.capsules import state_codec as sc
    from capsule_rollout.capsules import state_reader  # noqa: F401 - loaded lazily by decode: instrumented here
    from capsule_rollout.capsules.graph.names import GraphNamespace
    from capsule_rollout.capsules.graph.read import split
    from capsule_rollout.capsules.graph.walk import walk
    from capsule_rollout.capsules.state_codec import StateDecodeError, decode

import importlib.util  # noqa: E402 - after the instrumented imports

import numpy as np  # noqa: E402


def _pristine_reader():
    """A second copy of `state_reader`, not instrumented, whose allocations are the ones measured: atheris's
    instrumentation makes every frame larger, and a refusal 200 levels deep turns its frames into objects."""
    spec = importlib.util.spec_from_file_location("pristine_state_reader", state_reader.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Decoder


PRISTINE = _pristine_reader()

COUNTS = {"inputs": 0, "read": 0, "refused": 0, "worst_peak_share": 0.0}
START = time.monotonic()


def seeds() -> list[bytes]:
    """Real snapshots' parts and assorted encodings: where the fuzzer starts."""
    from capsule_rollout.capsules import Arena, snapshot
    from capsule_rollout.envs.suites import make_env

    env = make_env("tests.envs.broken_envs:make_counter", cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=1)
    env.step(np.zeros(2, np.float32))
    capsule = snapshot(arena)
    blob = bytes(capsule.buffer("env/python")[: int(capsule.buffer("env/python_len")[0])].numpy())
    out = [p for p in split(blob) if p]
    for value in ([1, 2.5, "x", b"y", None, True], {"a": (1, 2), 3: [4.0] * 9}, np.arange(6).reshape(2, 3),
                  {1, 2, frozenset({3})}, [[[[1]]]], (range(3), slice(1, 2), 1j, Ellipsis)):
        out.append(sc.encode(value))
    return out


def namespace() -> GraphNamespace:
    from capsule_rollout.envs.suites import make_env

    env = make_env("tests.envs.broken_envs:make_counter", cameras=())
    refs: set[str] = set()
    walk(env, refs)
    return GraphNamespace(frozenset(refs))


NAMES = None


def one_input(data: bytes) -> None:
    COUNTS["inputs"] += 1
    try:  # instrumented: guides the fuzzer; nothing but the reader's error may escape
        decode(data, NAMES)
        COUNTS["read"] += 1
    except StateDecodeError:
        COUNTS["refused"] += 1
    tracemalloc.reset_peak()  # traced all along (started once: starting and stopping it per input grows the heap)
    before = tracemalloc.get_traced_memory()[0]
    try:  # the same bytes through the reader as shipped, its allocations traced
        PRISTINE(data, NAMES).decode()
    except StateDecodeError:
        pass
    peak = tracemalloc.get_traced_memory()[1] - before
    bound = sc.MEMORY_PER_BYTE * len(data) + (1 << 20) + 3 * len(data)  # the reader's, and its copies of the input
    COUNTS["worst_peak_share"] = max(COUNTS["worst_peak_share"], peak / bound)
    if peak > bound:
        raise RuntimeError(f"{peak:,} bytes allocated reading {len(data):,} (bound {bound:,})")
    if COUNTS["inputs"] % 2000 == 0:
        report()


def report() -> None:
    print(json.dumps({**COUNTS, "seconds": round(time.monotonic() - START, 1)}), file=sys.stderr, flush=True)


def main() -> None:
    global NAMES
    NAMES = namespace()
    args = list(sys.argv)
    corpus = [a for a in args[1:] if not a.startswith("-")]
    from pathlib import Path

    if corpus and not Path(corpus[0]).is_file():  # a directory to grow (a file: one input to run again)
        for i, s in enumerate(seeds()):
            path = Path(corpus[0]) / f"seed-{i}"
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_bytes(s)
    tracemalloc.start()
    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
