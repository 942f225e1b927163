"""export_checkpoint: a training checkpoint without its optimizer state (the shipped form)."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.configs import ExportCheckpointConfig
from experiments.console import make_console
from experiments.result import ExperimentResult
from models.checkpoint import WEIGHTS_FILE, export_weights


def run(config: ExportCheckpointConfig) -> ExperimentResult:
    if not config.src or not config.out:
        raise ValueError("--src and --out are required")
    note = {"evaluation": json.loads(Path(config.eval).read_text())} if config.eval else None
    out = export_weights(config.src, config.out, note=note)
    size = (out / WEIGHTS_FILE).stat().st_size
    make_console().print(f"exported {config.src} -> {out} ({size / 1e6:.2f} MB of weights)")
    return ExperimentResult({"out": str(out), "weights_bytes": size})
