"""The GPU check's machinery: a step (one command and the JSON summary it writes), run in its own process
group with a timeout and recorded whatever happens; pytest's junit counts; the CUDA environment. The
command, its plan of steps and its report are `experiments/gpu_check.py`."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import torch

TAIL_CHARS = 4000


@dataclass(frozen=True)
class Step:
    """One check: a command, and the JSON summary it writes (None: none)."""

    name: str
    argv: tuple[str, ...]
    json: Path | None = None


def run_step(step: Step, out: Path, timeout_s: float) -> dict:
    """Run one step in its own process group; its record (never raises for the step's own failure)."""
    log = out / f"{step.name}.log"
    if step.json is not None and step.json.exists():
        step.json.unlink()  # a summary from an earlier run must not pass for this one's
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(step.argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step and what it started (Ray's processes)
            proc.wait()
            code = None
    record = {"name": step.name, "command": " ".join(step.argv), "exit_code": code, "timed_out": code is None,
              "seconds": round(time.perf_counter() - t0, 1), "log": str(log), "summary": None}
    if step.json is not None and step.json.exists():
        try:
            record["summary"] = json.loads(step.json.read_text())
        except ValueError as exc:
            record["summary_error"] = f"{step.json}: {exc}"
    record["ok"] = code == 0
    if not record["ok"]:
        text = log.read_text(errors="replace")
        record["tail"] = text[-TAIL_CHARS:]
    return record


def junit_counts(path: Path) -> dict | None:
    """tests / failures / errors / skipped of a pytest junit file (None when there is none)."""
    if not path.exists():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def environment() -> dict:
    """What this machine runs the checks with (in this process; needs CUDA)."""
    from capsule_rollout.capsules import digest_backend

    info: dict = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                  "capability": list(torch.cuda.get_device_capability(0))}
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001 - reported, the digest falls back
        info["triton"] = f"not importable ({type(exc).__name__}: {exc})"
    info["digest_backend"] = digest_backend(torch.device("cuda", 0)).to_json()
    return info
