"""export_checkpoint: a training checkpoint without its optimizer state (the shipped form)."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.configs import ExportCheckpointConfig
from experiments.console import make_console
from experiments.result import ExperimentResult, checking_inputs
from models.checkpoint import WEIGHTS_FILE, Checkpoint, export_weights
from policies.torch_policy import KIND as TORCH_POLICY_KIND
from rollout.host_factory import ACTING_INFO, recorded_acting


def run(config: ExportCheckpointConfig) -> ExperimentResult:
    if not config.src or not config.out:
        raise ValueError("--src and --out are required")
    note = {"evaluation": json.loads(Path(config.eval).read_text())} if config.eval else {}
    given = {k: v for k, v in (("n_exec", config.n_exec), ("noise_scale", config.noise_scale)) if v is not None}
    if given:
        with checking_inputs():
            source = Checkpoint(config.src)
            torch_policy = source.meta.get("kind") == TORCH_POLICY_KIND
            if torch_policy and config.noise_scale is not None:
                raise ValueError("--noise_scale scales the flow policy's noise; a TorchPolicy hands its noise to the "
                                 "module as drawn: leave --noise_scale unset")
            chunk = (source.config if torch_policy else source.config.get("model", {})).get("chunk_length")
            if chunk is not None and config.n_exec is not None and config.n_exec > chunk:
                raise ValueError(f"--n_exec {config.n_exec} exceeds the policy's chunk length ({chunk})")
        note[ACTING_INFO] = {**recorded_acting(config.src), **given}
    out = export_weights(config.src, config.out, note=note or None)
    size = (out / WEIGHTS_FILE).stat().st_size
    acting = recorded_acting(str(out))
    deployed = f"; deployed with {', '.join(f'{k} {v}' for k, v in acting.items())}" if acting else ""
    make_console().print(f"exported {config.src} -> {out} ({size / 1e6:.2f} MB of weights{deployed})")
    return ExperimentResult({"out": str(out), "weights_bytes": size, "acting": acting})
