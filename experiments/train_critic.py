"""train_critic: the distributional value critic from a zarr store of episodes."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from critics.returns import normalized_returns
from critics.value_critic import ACTOR_POLICY, KIND, CriticConfig, ValueCritic
from experiments.configs import TrainCriticConfig
from experiments.console import make_console
from experiments.paths import resolve_input
from experiments.policy_data import load_training_arrays
from experiments.result import ExperimentResult
from models.checkpoint import open_training_dir, save_checkpoint
from models.encoders import random_shift
from models.trainer import LoopConfig, make_optimizer, train
from policies.flow_policy import load_policy


def value_targets(data: dict, max_steps: int) -> np.ndarray:
    """Per-step normalised returns of every episode in `data` (see critics.returns)."""
    ends = data["episode_ends"]
    starts = np.concatenate([[0], ends[:-1]])
    out = np.zeros(len(data["states"]), np.float32)
    for lo, hi, meta in zip(starts, ends, data["metas"]):
        out[lo:hi] = normalized_returns(data["rewards"][lo:hi], meta.success, max_steps)
    return out


def executed_plans(actions: np.ndarray, ends: np.ndarray, plan_steps: int) -> np.ndarray:
    """`(N, plan_steps, A)`: for every step, the actions executed from it on within its episode (the
    last action repeated past the episode's end)."""
    ends = np.asarray(ends, np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    offsets = np.arange(plan_steps)
    index = np.arange(len(actions))[:, None] + offsets[None, :]
    last = np.repeat(ends - 1, ends - starts)[:, None]
    return actions[np.minimum(index, last)].astype(np.float32)


def run(config: TrainCriticConfig) -> ExperimentResult:
    console = make_console()
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out)
    ckpt = open_training_dir(out, kind=KIND, resume=config.resume)
    torch.manual_seed(config.seed)
    model_config = (CriticConfig.from_json(ckpt.config["model"]) if ckpt else
                    CriticConfig(cameras=config.cameras, episode_limit=config.max_steps if config.time_input else 0,
                                 actor_input=config.actor_input, plan_steps=config.plan_steps))
    model = ValueCritic(model_config)
    # a fresh run may start its encoders from a policy's (read first: a bad path fails before the data loads)
    init = load_policy(resolve_input(config.init_policy)) if config.init_policy and not ckpt else None
    data = load_training_arrays(config.data, model_config.cameras, model.tokenizer)
    if model_config.actor_input and not ckpt and len(np.unique(data["actors"])) < 2:
        # one actor only (demonstrations before any rollout): there is nothing to tell apart, and an input
        # the critic never saw vary would be asked at run time for an actor it never saw
        console.print("every episode has the same actor: this critic is trained without the actor input")
        model_config = dataclasses.replace(model_config, actor_input=False)
        torch.manual_seed(config.seed)
        model = ValueCritic(model_config)
    targets = torch.from_numpy(value_targets(data, config.max_steps))
    images = {k: torch.from_numpy(v) for k, v in data["images"].items()}
    states = torch.from_numpy(data["states"])
    tokens = torch.from_numpy(data["tokens"])
    steps = torch.from_numpy(data["episode_steps"])
    actors = torch.from_numpy(data["actors"])
    plan_steps = model_config.plan_steps
    if plan_steps and data["actions"].shape[1] != model_config.action_dim:
        raise ValueError(f"{config.data} records {data['actions'].shape[1]}-d actions; the critic's plan "
                         f"takes {model_config.action_dim}-d ones")
    plans = torch.from_numpy(executed_plans(data["actions"], data["episode_ends"], plan_steps)) if plan_steps else None
    n_ep = len(data["episode_ends"])
    rng = np.random.default_rng(config.seed)
    val_eps = rng.choice(n_ep, size=max(1, int(round(config.val_fraction * n_ep))), replace=False)
    starts = np.concatenate([[0], data["episode_ends"][:-1]])
    is_val = np.zeros(len(states), bool)
    for e in val_eps:
        is_val[starts[e] : data["episode_ends"][e]] = True
    train_idx = torch.from_numpy(np.flatnonzero(~is_val))
    val_idx = torch.from_numpy(np.flatnonzero(is_val))
    if not len(train_idx):
        raise SystemExit("error: no training steps left after the validation split; record more episodes")
    loop = LoopConfig(steps=config.steps, lr=config.lr, eval_every=config.eval_every,
                      checkpoint_every=config.checkpoint_every, progress=config.progress)
    optimizer = make_optimizer(model, loop)
    generator = torch.Generator().manual_seed(config.seed)
    start, evals = 0, []
    if ckpt:
        ckpt.load_model(model)
        generator.set_state(ckpt.load_optimizer(optimizer)["generator"])
        start, evals = ckpt.step, list(ckpt.meta["info"].get("evals", []))
        console.print(f"resuming {out} from step {start}")
    else:
        model.set_normalization(states[train_idx])
        if init is not None:
            copied = model.load_backbone(init)
            console.print(f"encoders {', '.join(copied)} from {config.init_policy}")
    params = sum(p.numel() for p in model.parameters())
    n_policy = int(np.sum(data["actors"][data["episode_ends"] - 1] == ACTOR_POLICY))  # one step per episode
    console.print(f"critic: {params / 1e6:.2f} M parameters; {n_ep} episodes ({len(val_eps)} held out; "
                  f"{n_ep - n_policy} demonstrations, {n_policy} rollouts"
                  + (", told apart" if model_config.actor_input else "") + ")")

    def loss_fn(step: int) -> torch.Tensor:
        idx = train_idx[torch.randint(0, len(train_idx), (config.batch_size,), generator=generator)]
        imgs = {k: random_shift(v[idx], config.shift, generator) if config.shift else v[idx] for k, v in images.items()}
        plan = None
        if plans is not None:  # hide some plans: the same critic learns the state's value too
            plan = plans[idx].clone()
            plan[torch.rand(len(idx), generator=generator) < config.plan_dropout] = float("nan")
        return model.loss(imgs, states[idx], model.embed_language(tokens[idx]), targets[idx], steps[idx], actors[idx],
                          plan)

    def evaluate(step: int) -> dict:
        """Held-out loss and value error; a plan critic's with the plans given and, `_state_only`, without."""
        modes = {"": True, "_state_only": False} if plans is not None else {"": False}
        out = {}
        for suffix, with_plan in modes.items():
            losses, errors = [], []
            for chunk in torch.split(val_idx, 512):
                imgs = {k: v[chunk] for k, v in images.items()}
                lang = model.embed_language(tokens[chunk])
                logits = model.logits(imgs, states[chunk], lang, steps[chunk], actors[chunk],
                                      plans[chunk] if with_plan else None)
                losses.append(float(model.loss_from_logits(logits, targets[chunk])) * len(chunk))
                errors.append((model.value(logits) - targets[chunk]).abs())
            out[f"val_loss{suffix}"] = sum(losses) / len(val_idx)
            out[f"val_value_mae{suffix}"] = float(torch.cat(errors).mean())
        return out

    def save(step: int) -> None:
        save_checkpoint(
            out, kind=KIND, model=model, step=step, optimizer=optimizer, extra_tensors={"generator": generator.get_state()},
            config={"model": model_config.to_json(), "tokenizer": model.tokenizer.to_json(),
                    "train": dataclasses.asdict(config)},
            info={"data": config.data, "episodes": n_ep, "evals": evals},
        )

    t0 = time.perf_counter()
    train(model=model, optimizer=optimizer, loss_fn=loss_fn, config=loop, start_step=start, evaluate=evaluate,
          save=save, desc="train_critic", log=evals)
    summary = {
        "checkpoint": str(out),
        "parameters": params,
        "steps": config.steps,
        "resumed_from": start,
        "train_seconds": time.perf_counter() - t0,
        "episodes": n_ep,
        "evals": evals,
    }
    return ExperimentResult(summary)
