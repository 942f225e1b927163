"""A small training loop: AdamW with warm-up and cosine decay, progress bar, periodic
evaluation and checkpoints, resume from the last checkpoint."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm import tqdm


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    lr: float = 3e-4
    weight_decay: float = 1e-4
    warmup: int = 200
    eval_every: int = 500
    checkpoint_every: int = 500
    grad_clip: float = 1.0
    progress: bool = True


def lr_at(step: int, config: LoopConfig) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model: torch.nn.Module, config: LoopConfig) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
    )


def train(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[int], torch.Tensor],
    config: LoopConfig,
    start_step: int = 0,
    evaluate: Callable[[int], dict] | None = None,
    save: Callable[[int], None] | None = None,
    desc: str = "train",
    log: list[dict] | None = None,
) -> list[dict]:
    """Run steps `start_step` .. `config.steps - 1`; evaluations are appended to `log` (returned)."""
    log = [] if log is None else log
    bar = tqdm(range(start_step, config.steps), desc=desc, disable=not config.progress, initial=start_step,
               total=config.steps)
    ema, t0 = None, time.perf_counter()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        model.train()
        loss = loss_fn(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        value = float(loss.detach())
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        bar.set_postfix(loss=f"{ema:.4f}")
        done = step + 1
        if evaluate is not None and (done % config.eval_every == 0 or done == config.steps):
            model.eval()
            with torch.no_grad():
                metrics = {"step": done, "train_loss": ema, "elapsed_s": time.perf_counter() - t0, **evaluate(done)}
            log.append(metrics)
            bar.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
        if save is not None and (done % config.checkpoint_every == 0 or done == config.steps):
            save(done)
    bar.close()
    return log
