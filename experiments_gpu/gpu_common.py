"""What the GPU slot checks share: the checkout on sys.path, the log, the entry-point shim, nvidia-smi."""


from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
CKPT = ROOT / "capsule_rollout" / "experiments" / "checkpoints"
T0 = time.monotonic()
TEXTS = ("pick up the red block", "put the green block on the blue pad", "move the yellow block to the left",
         "stack the blue block on top of the red block", "place the purple block next to the orange block")


def log(*parts) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s]", *parts, flush=True)


def elapsed() -> float:
    return time.monotonic() - T0


# -- entry points when the package runs from a checkout that was never installed ---------------------------
def ensure_entry_points() -> str | None:
    """The project's checkpoint loaders and suites are entry points (pyproject.toml). Run from a plain
    checkout (PYTHONPATH, no `pip install -e`), none is registered: write a minimal dist-info for them into a
    temp dir on sys.path (and PYTHONPATH, for spawned processes). Returns that dir, or None if not needed."""
    from importlib.metadata import entry_points

    if any(e.name == "flow_policy" for e in entry_points(group="capsule_rollout.checkpoints")):
        return None
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = []
    for group, items in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in items.items()]
        lines.append("")
    site = Path(tempfile.mkdtemp(prefix="capsule_meta_"))
    info = site / f"capsule_rollout-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("\n".join(lines))
    sys.path.append(str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(site)) if p)
    import importlib

    importlib.invalidate_caches()
    return str(site)


# -- nvidia-smi ----------------------------------------------------------------------------------------------
def smi(*query: str) -> list[list[str]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10)
    except Exception:
        return None
    if out.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]


class SmiSampler:
    """Samples per-process and total GPU memory (MiB) and utilization every `period` s in a thread."""

    def __init__(self, period: float = 1.0) -> None:
        self.period, self.stop_flag = period, threading.Event()
        self.per_pid: dict[str, float] = {}
        self.total_max = 0.0
        self.util: list[float] = []
        self.samples = 0
        self.available = shutil.which("nvidia-smi") is not None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop_flag.is_set():
            apps = smi("--query-compute-apps=pid,used_memory")
            for row in apps or []:
                try:
                    self.per_pid[row[0]] = max(self.per_pid.get(row[0], 0.0), float(row[1]))
                except (ValueError, IndexError):
                    pass
            gpu = smi("--query-gpu=memory.used,utilization.gpu")
            if gpu:
                try:
                    self.total_max = max(self.total_max, float(gpu[0][0]))
                    self.util.append(float(gpu[0][1]))
                except (ValueError, IndexError):
                    pass
            self.samples += 1
            self.stop_flag.wait(self.period)

    def __enter__(self):
        if self.available:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_flag.set()
        if self.available:
            self.thread.join(timeout=15)

    def report(self) -> dict:
        return {"available": self.available, "samples": self.samples, "per_pid_max_mib": dict(self.per_pid),
                "gpu_used_max_mib": self.total_max,
                "gpu_util_mean": statistics.fmean(self.util) if self.util else None,
                "gpu_util_max": max(self.util) if self.util else None}
