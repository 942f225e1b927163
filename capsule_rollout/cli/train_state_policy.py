"""train_state_policy: behaviour cloning of a small state -> action-chunk network (`StateMLP`).

Reads a zarr store's `state` and `action` (e.g. `collect_demos --env ...` with the
suite's scripted policy), fits action chunks with mean squared error, and saves a
`TorchPolicy` checkpoint (`policies/torch_policy.py`) that `sim_rollout`,
`replay` and the Ray actors load like any policy.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from capsule_rollout.cli.console import make_console
from capsule_rollout.commands.configs import TrainStatePolicyConfig
from capsule_rollout.commands.result import ExperimentResult, UsageError
from capsule_rollout.policies.rollout_policy import PolicySpec
from capsule_rollout.policies.state_mlp import StateMLP
from capsule_rollout.policies.torch_policy import save_torch_policy
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.sharded_reader import open_episode_reader


def chunks(actions: np.ndarray, chunk_length: int) -> np.ndarray:
    """(T, A) -> (T, horizon, A): each step's next `chunk_length` actions, the last one repeated past the end."""
    idx = np.minimum(np.arange(len(actions))[:, None] + np.arange(chunk_length)[None], len(actions) - 1)
    return actions[idx]


def run(config: TrainStatePolicyConfig) -> ExperimentResult:
    console = make_console()
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    reader = open_episode_reader(config.data)
    states, targets, used = [], [], 0
    for episode in reader.episodes(keys=[S.STATE, S.ACTION]):
        if config.successes_only and not episode.meta.success:
            continue
        states.append(episode.steps[S.STATE])
        targets.append(chunks(episode.steps[S.ACTION], config.chunk_length))
        used += 1
    if not used:
        raise UsageError(f"{config.data} holds no usable episodes (successes_only={config.successes_only})")
    x = torch.from_numpy(np.concatenate(states)).float()
    y = torch.from_numpy(np.concatenate(targets)).float().clamp(-1, 1)
    model = StateMLP(x.shape[1], y.shape[2], config.chunk_length, hidden=config.hidden)
    model.set_normalization(x)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.steps)
    gen = torch.Generator().manual_seed(config.seed)
    t0, losses = time.perf_counter(), []
    for step in range(config.steps):
        batch = torch.randint(0, len(x), (config.batch,), generator=gen)
        loss = torch.nn.functional.mse_loss(model({"state": x[batch]}), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % max(1, config.steps // 10) == 0:
            console.print(f"step {step + 1}/{config.steps}: loss {np.mean(losses[-100:]):.5f}")
    spec = PolicySpec(config.chunk_length, int(y.shape[2]), ("state",))
    kwargs = {"state_dim": int(x.shape[1]), "action_dim": int(y.shape[2]), "chunk_length": config.chunk_length,
              "hidden": config.hidden}
    seconds = time.perf_counter() - t0
    save_torch_policy(config.out, model, factory="capsule_rollout.policies.state_mlp:StateMLP", kwargs=kwargs, spec=spec,
                      shapes={"state": ((int(x.shape[1]),), "float32")}, step=config.steps,
                      info={"data": config.data, "episodes": used, "samples": len(x), "train_s": seconds})
    summary = {"episodes": used, "samples": len(x), "final_loss": float(np.mean(losses[-100:])),
               "train_s": seconds, "out": config.out}
    console.print(f"{used} episodes, {len(x)} samples, loss {summary['final_loss']:.5f}, {seconds:.0f} s -> {config.out}")
    return ExperimentResult(summary)
