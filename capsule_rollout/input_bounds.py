"""Bounds on what a command is asked to do, checked before any work starts: numbers that must be finite, seeds
within numpy's seeding range, counts against what this machine can hold, output paths that can be written.

Standard library only, importing no layer of the project: configs check with it in `__post_init__` (what needs
no look at the machine), entry points before they build anything (memory, paths). Each check raises
`ValueError` saying the limit and how to fix it (the command line: one line, exit 2).

The memory figures are measured on the tabletop example with the shipped policy and critic (docs/BENCHMARKS.md,
"Reliability"): an env of longer episodes, or larger models, needs more, so they bound what cannot fit, not
what will.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

SEED_LIMIT = 2**32
"""Seeds are 0 .. SEED_LIMIT - 1: numpy's seeding range (`np.random.seed`, `RandomState`), which many envs seed
their generators with; the store records them as int64."""
DRIVER_BYTES_PER_EPISODE = 16_000
"""What a run's driver keeps per episode until the run ends: its work item, its report and the recorded
episode's step arrays without images (measured: 9.5 KB for a 48-step tabletop episode, 80 steps at most)."""
ACTOR_BYTES = 560_000_000
"""Memory of one rollout actor process with one env slot (torch, MuJoCo, the host; measured: 564 MB RSS)."""
SLOT_BYTES = 24_000_000
"""Memory of each further env slot of an actor (measured: 164 MB for 7 more tabletop slots)."""
MAX_ACTORS = 10_000
"""One driver records for about 1,000 actors before its thread saturates (docs/DESIGN.md, "Recording at scale");
ten times that is refused rather than left to queue in Ray."""
MEMORY_SHARE = 0.8
"""The share of this machine's available memory a run may plan to use."""


def check_finite(value: float | None, option: str, hint: str = "") -> None:
    """`value` (None passes) must be a finite number; `hint` says what to give instead (e.g. "0: no deadline")."""
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{option} must be a finite number, got {value}" + (f" ({hint})" if hint else ""))


def check_seeds(first: int, count: int, first_option: str, count_option: str = "") -> None:
    """Seeds `first` .. `first + count - 1` within numpy's seeding range (`count_option`: the option giving
    `count`, named when it is what does not fit)."""
    span = f"0 .. {SEED_LIMIT - 1} (numpy's seeding range, which envs seed their generators with)"
    if count > SEED_LIMIT:
        raise ValueError(f"{count_option or 'seeds'} {count:,}: at most {SEED_LIMIT:,} seeds, as seeds are {span}")
    if first < 0 or first + count > SEED_LIMIT:
        also = f" with {count_option} {count:,}" if count_option and count > 1 else ""
        raise ValueError(f"{first_option} {first}: seeds are {span}; pick at most {SEED_LIMIT - max(count, 1)}"
                         f"{also}")


def available_memory() -> int:
    """Bytes of memory available to a new process here (`MemAvailable`; else the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: nothing is refused for memory


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n < 1e13 else f"{n / 1e12:,.0f} TB"


def check_episodes(episodes: int, option: str) -> None:
    """A run of `episodes` (repeats and retries counted) fits the driver's memory."""
    budget = int(available_memory() * MEMORY_SHARE)
    most = budget // DRIVER_BYTES_PER_EPISODE
    if episodes > most:
        raise ValueError(f"{option}: {episodes:,} episodes in one run; its driver keeps about "
                         f"{DRIVER_BYTES_PER_EPISODE // 1000} KB per episode ({_gb(episodes * DRIVER_BYTES_PER_EPISODE)}"
                         f" in all) and this machine has {_gb(budget / MEMORY_SHARE)} available: at most {most:,} per "
                         "run. Split the seeds over runs (--seeds.first, --seeds.count) into the same --out: a run "
                         "resumes it")


def check_actors(actors: int, slots: int, cpus_per_actor: float, local: bool) -> None:
    """`actors` actors of `slots` env slots each fit: one actor on this machine, and with a Ray started here
    (`local`) as many as its CPUs place at once."""
    if actors > MAX_ACTORS:
        raise ValueError(f"--actors {actors:,}: one driver records for about 1,000 actors (docs/DESIGN.md, "
                         f"'Recording at scale'); at most {MAX_ACTORS:,}. Run several drivers on stores of their own")
    budget = int(available_memory() * MEMORY_SHARE)
    each = ACTOR_BYTES + max(slots - 1, 0) * SLOT_BYTES
    if slots > 1 and each > budget:
        most = max((budget - ACTOR_BYTES) // SLOT_BYTES + 1, 0)
        raise ValueError(f"--slots {slots:,}: an actor of {slots:,} env slots needs about {_gb(each)} (about "
                         f"{SLOT_BYTES // 1_000_000} MB a slot) and this machine has {_gb(budget / MEMORY_SHARE)} "
                         f"available: at most {most:,} slots. Use fewer --slots (and more --actors on a cluster)")
    placed = min(actors, max(int((os.cpu_count() or 1) / max(cpus_per_actor, 1e-9)), 1)) if local else min(actors, 1)
    if placed * each > budget:
        most = max(budget // each, 1)
        raise ValueError(f"--actors {actors:,} of {slots:,} slot(s): the {placed:,} this machine's CPUs place need about "
                         f"{_gb(placed * each)} and it has {_gb(budget / MEMORY_SHARE)} available: at most {most:,} "
                         "actors here. Use fewer --actors (or --slots), or join a cluster (RAY_ADDRESS)")


def check_run(episodes: int, episodes_option: str, actors: int, slots: int, cpus_per_actor: float) -> None:
    """A rollout run's counts fit this machine: its episodes in the driver, its actors and their slots (`actors`
    0: in this process); the Ray it would use is started here unless `RAY_ADDRESS` names a cluster."""
    check_episodes(episodes, episodes_option)
    check_actors(max(actors, 1), slots, cpus_per_actor, local=not actors or not os.environ.get("RAY_ADDRESS"))


def check_output_dir(path: str | os.PathLike, option: str = "--out", beside: bool = False) -> None:
    """`path` can be made or written as a directory: an existing directory that is writable, or a new one whose
    nearest existing parent is a writable directory. `beside`: it is written beside `path` first (a temporary
    directory renamed into place), so its parent must be writable too."""
    path = Path(path).expanduser()
    if beside and path.exists():
        check_output_dir(path.parent, f"{option} {path} is written beside it first:")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; give a directory (new, or one to add to)")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{option} {path}: {probe} is a file, not a directory; give a path under a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        made = "" if probe == path else f" (where {path} would be made)"
        raise ValueError(f"{option} {path}: {probe}{made} is not writable by this user; give a directory you can "
                         "write")
