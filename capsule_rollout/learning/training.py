"""What every training run shares: the run directory (fresh or resumed), the optimizer and the batch
generator restored with the weights, and one save that writes a resumable checkpoint."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from capsule_rollout.learning.options import Loop
from capsule_rollout.models.checkpoint import Checkpoint, open_training_dir, save_checkpoint
from capsule_rollout.models.trainer import LoopConfig, make_optimizer, train

Log = Callable[[str], None]


def open_run(out: str | Path, *, kind: str, resume: bool, seed: int, threads: int = 0) -> Checkpoint | None:
    """The resumable checkpoint in `out` (None for a fresh run), with torch's threads and seed set."""
    if threads:
        torch.set_num_threads(threads)
    ckpt = open_training_dir(Path(out), kind=kind, resume=resume)
    torch.manual_seed(seed)
    return ckpt


@dataclass
class Fit:
    """A model with its optimizer and batch generator, at `start` (0, or where a resumed run stopped)."""

    out: Path
    kind: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    loop: LoopConfig
    start: int = 0
    evals: list[dict] = field(default_factory=list)  # the trainer appends each evaluation

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def save(self, step: int, *, config: dict, info: dict) -> None:
        save_checkpoint(self.out, kind=self.kind, model=self.model, step=step, optimizer=self.optimizer,
                        extra_tensors={"generator": self.generator.get_state()}, config=config,
                        info={**info, "evals": self.evals})

    def run(self, loss_fn: Callable[[int], torch.Tensor], evaluate: Callable[[int], dict],
            save: Callable[[int], None], desc: str) -> float:
        """Train from `start` to the loop's steps; returns the wall seconds."""
        t0 = time.perf_counter()
        train(model=self.model, optimizer=self.optimizer, loss_fn=loss_fn, config=self.loop, start_step=self.start,
              evaluate=evaluate, save=save, desc=desc, log=self.evals)
        return time.perf_counter() - t0


def start_fit(out: str | Path, kind: str, model: torch.nn.Module, ckpt: Checkpoint | None, loop: LoopConfig,
              seed: int, log: Log) -> Fit:
    """The optimizer and generator for `model`; a resumed run's weights, optimizer, generator and evaluations
    loaded from `ckpt`."""
    optimizer = make_optimizer(model, loop)
    fit = Fit(Path(out), kind, model, optimizer, torch.Generator().manual_seed(seed), loop)
    if ckpt:
        ckpt.load_model(model)
        fit.generator.set_state(ckpt.load_optimizer(optimizer)["generator"])
        fit.start, fit.evals = ckpt.step, list(ckpt.meta["info"].get("evals", []))
        log(f"resuming {out} from step {fit.start}")
    return fit


def loop_config(loop: Loop) -> LoopConfig:
    """The trainer's loop from a run's loop options."""
    return LoopConfig(steps=loop.steps, lr=loop.lr, eval_every=loop.eval_every,
                      checkpoint_every=loop.checkpoint_every, progress=loop.progress)


def run_config(model_config, tokenizer, config) -> dict:
    """The `config` section of a checkpoint: the model's, the tokenizer's and the run's options."""
    return {"model": model_config.to_json(), "tokenizer": tokenizer.to_json(), "train": dataclasses.asdict(config)}
