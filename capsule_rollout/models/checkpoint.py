"""Checkpoints: `weights.safetensors` (+ `optimizer.safetensors` to resume) and `checkpoint.json`.

Never pickle. Files are written to temp names and renamed, weights first and the
JSON last, and the JSON records each tensor file's sha256, so a reader either
sees a whole checkpoint or refuses it with a clear error (torn, truncated,
tampered, or of another format version).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

FORMAT = "capsule-rollout/checkpoint"
FORMAT_VERSION = 1
META_FILE = "checkpoint.json"
WEIGHTS_FILE = "weights.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"


class CheckpointError(ValueError):
    """A checkpoint directory cannot be used; the message says why and what to do."""


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, entries in state["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"state.{pid}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = value
    for key, value in meta.get("scalars", {}).items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    kind: str,
    model: torch.nn.Module,
    config: dict,
    step: int,
    optimizer: torch.optim.Optimizer | None = None,
    extra_tensors: dict[str, torch.Tensor] | None = None,
    info: dict | None = None,
) -> Path:
    """Write a checkpoint; with `optimizer` (and `extra_tensors`, e.g. RNG state) it can resume training."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    weights_bytes = safetensors.torch.save(weights)
    _atomic_write(directory / WEIGHTS_FILE, weights_bytes)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "config": config,
        "step": step,
        "created_at": time.time(),
        "files": {WEIGHTS_FILE: _sha(weights_bytes)},
        "info": info or {},
    }
    if optimizer is not None:
        tensors, opt_meta = _flatten_optimizer(optimizer)
        tensors.update({f"extra.{k}": v.detach().cpu().contiguous() for k, v in (extra_tensors or {}).items()})
        opt_bytes = safetensors.torch.save(tensors)
        _atomic_write(directory / OPTIMIZER_FILE, opt_bytes)
        meta["files"][OPTIMIZER_FILE] = _sha(opt_bytes)
        meta["optimizer"] = opt_meta
    elif (directory / OPTIMIZER_FILE).exists():
        (directory / OPTIMIZER_FILE).unlink()  # a stale optimizer would not match these weights
    _atomic_write(directory / META_FILE, json.dumps(meta, indent=2).encode())
    return directory


class Checkpoint:
    """A validated checkpoint: `meta`, `weights` and (if saved) the optimizer state."""

    def __init__(self, directory: str | os.PathLike, *, kind: str | None = None) -> None:
        self.directory = Path(directory)
        path = self.directory / META_FILE
        if not path.exists():
            raise CheckpointError(f"{self.directory} has no {META_FILE}: not a checkpoint (or not finished writing)")
        try:
            self.meta = json.loads(path.read_text())
        except ValueError:
            raise CheckpointError(f"{path} is not valid JSON") from None
        if self.meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: format {self.meta.get('format')!r} is not {FORMAT!r}")
        version = self.meta.get("format_version")
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"{path}: checkpoint format version {version!r}; this code reads version {FORMAT_VERSION}. "
                "Retrain, or use the code version that wrote it."
            )
        if kind is not None and self.meta.get("kind") != kind:
            raise CheckpointError(f"{self.directory} holds a {self.meta.get('kind')!r} checkpoint, not a {kind!r}")
        self.weights = self._tensors(WEIGHTS_FILE)

    def _tensors(self, name: str) -> dict[str, torch.Tensor]:
        path = self.directory / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing") from None
        if _sha(data) != self.meta["files"].get(name):
            raise CheckpointError(f"{path} does not match the sha256 in {META_FILE} (torn or tampered checkpoint)")
        try:
            return safetensors.torch.load(data)
        except Exception as exc:  # the rust reader raises its own type
            raise CheckpointError(f"{path} is unreadable ({exc})") from None

    @property
    def config(self) -> dict:
        return self.meta["config"]

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def resumable(self) -> bool:
        return OPTIMIZER_FILE in self.meta["files"]

    def load_model(self, model: torch.nn.Module) -> torch.nn.Module:
        missing, unexpected = model.load_state_dict(self.weights, strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"{self.directory}: weights do not fit the model (missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]})"
            )
        return model

    def load_optimizer(self, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
        """Restore the optimizer; returns the extra tensors saved with it."""
        if not self.resumable:
            raise CheckpointError(f"{self.directory} was saved without optimizer state; it cannot resume training")
        tensors = self._tensors(OPTIMIZER_FILE)
        extra = {k[len("extra."):]: v for k, v in tensors.items() if k.startswith("extra.")}
        opt = {k: v for k, v in tensors.items() if not k.startswith("extra.")}
        optimizer.load_state_dict(_unflatten_optimizer(opt, self.meta["optimizer"]))
        return extra


def portable_paths(value: Any, root: Path) -> Any:
    """`value` (a checkpoint's JSON) with every absolute path made relative to `root` when it lies inside it,
    and replaced by None when it does not: a shipped file names no directory of the machine it was made on."""
    if isinstance(value, dict):
        return {k: portable_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v, root) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        path = Path(os.path.normpath(value))
        return str(path.relative_to(root)) if path.is_relative_to(root) else None
    return value


def export_weights(source: str | os.PathLike, destination: str | os.PathLike, *, note: dict | None = None,
                   root: str | os.PathLike | None = None) -> Path:
    """Copy a checkpoint without its optimizer state (what gets shipped): weights + JSON.

    The weights are validated against the source's sha256 first; `note` is merged
    into the JSON's `info` (e.g. how the checkpoint was made and evaluated). Paths in the
    JSON are made relative to `root` (default: the working directory, the repository when
    run from the repository root) or dropped (`portable_paths`).
    """
    ckpt = Checkpoint(source)
    destination = Path(destination)
    if destination.resolve() == Path(source).resolve():
        raise ValueError("export to a different directory than the source")
    destination.mkdir(parents=True, exist_ok=True)
    weights_bytes = (ckpt.directory / WEIGHTS_FILE).read_bytes()
    _atomic_write(destination / WEIGHTS_FILE, weights_bytes)
    meta = {k: v for k, v in ckpt.meta.items() if k != "optimizer"}
    meta["files"] = {WEIGHTS_FILE: _sha(weights_bytes)}
    meta["info"] = {**meta.get("info", {}), "exported_from": str(Path(source).absolute()), **(note or {})}
    meta = portable_paths(meta, Path(os.path.normpath(Path(root or Path.cwd()).absolute())))
    if (destination / OPTIMIZER_FILE).exists():
        (destination / OPTIMIZER_FILE).unlink()
    _atomic_write(destination / META_FILE, json.dumps(meta, indent=2).encode())
    return destination


def update_info(directory: str | os.PathLike, **fields: Any) -> None:
    """Merge `fields` into a checkpoint's `info` (rewrites its JSON atomically; weights untouched)."""
    ckpt_meta = Checkpoint(directory).meta
    ckpt_meta["info"] = {**ckpt_meta.get("info", {}), **fields}
    _atomic_write(Path(directory) / META_FILE, json.dumps(ckpt_meta, indent=2).encode())


def load_model(directory: str | os.PathLike, *, kind: str, config_cls, model_cls, device: str = "cpu"):
    """A model of `model_cls` built from a checkpoint's config (`config_cls.from_json`) and weights, in eval mode."""
    ckpt = Checkpoint(directory, kind=kind)
    try:
        config = config_cls.from_json(ckpt.config["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: bad {kind} config ({exc})") from None
    return ckpt.load_model(model_cls(config)).to(device).eval()


def open_training_dir(out: Path, *, kind: str, resume: bool) -> Checkpoint | None:
    """The resumable checkpoint in a training run's `out`, None for a fresh run; refuses what it must not touch."""
    if not (out / META_FILE).exists():
        return None
    if not resume:
        raise SystemExit(f"error: {out} already holds a checkpoint; pass --resume true or choose another --out")
    ckpt = Checkpoint(out, kind=kind)
    if not ckpt.resumable:
        raise SystemExit(f"error: {out} holds a final checkpoint without optimizer state; choose another --out")
    return ckpt
