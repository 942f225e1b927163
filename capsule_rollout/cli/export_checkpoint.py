"""export_checkpoint: a training checkpoint without its optimizer state (the shipped form)."""

from __future__ import annotations

import json
from pathlib import Path

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import ExportCheckpointConfig
from capsule_rollout.commands.result import ExperimentResult, checking_inputs
from capsule_rollout.models.checkpoint import WEIGHTS_FILE, export_weights
from capsule_rollout.rollout.host_factory import ACTING_INFO, RunSpec, check_spec, recorded_acting
from capsule_rollout.rollout.rollout_host import HostConfig


def run(config: ExportCheckpointConfig) -> ExperimentResult:
    if not config.src or not config.out:
        raise ValueError("--src and --out are required")
    note = {"evaluation": json.loads(Path(config.eval).read_text())} if config.eval else {}
    given = {k: v for k, v in (("n_exec", config.n_exec), ("noise_scale", config.noise_scale)) if v is not None}
    acting = {**recorded_acting(config.src), **given}
    if given:
        with checking_inputs():  # a record a host can be built with: what check_spec accepts for this policy
            check_spec(RunSpec(policy=config.src, critic="", host=HostConfig(n_exec=acting.get("n_exec", 1)),
                                noise_scale=acting.get("noise_scale", 1.0)))
        note[ACTING_INFO] = acting
    out = export_weights(config.src, config.out, note=note or None)
    size = (out / WEIGHTS_FILE).stat().st_size
    deployed = f"; deployed with {', '.join(f'{k} {v}' for k, v in acting.items())}" if acting else ""
    make_console().print(f"exported {config.src} -> {out} ({size / 1e6:.2f} MB of weights{deployed})")
    return ExperimentResult({"out": str(out), "weights_bytes": size, "acting": acting})
