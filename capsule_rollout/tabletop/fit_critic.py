"""fit_critic: the distributional value critic from a store of episodes (demonstrations and rollouts),
with held-out episodes for its validation loss; resumable."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from capsule_rollout.critics.returns import executed_plans, value_targets
from capsule_rollout.learning.branch_values import BranchTable, branch_targets
from capsule_rollout.learning.options import TrainCriticConfig
from capsule_rollout.learning.policy_data import load_training_arrays
from capsule_rollout.learning.training import Log, loop_config, open_run, run_config, start_fit
from capsule_rollout.stores.episode_schema import PRIVILEGED
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.tabletop.encoders import random_shift
from capsule_rollout.tabletop.flow_policy import load_policy
from capsule_rollout.tabletop.value_critic import ACTOR_POLICY, KIND, CriticConfig, ValueCritic


def _model_config(config: TrainCriticConfig, ckpt, privileged_dim: int) -> CriticConfig:
    if ckpt:
        return CriticConfig.from_json(ckpt.config["model"])
    return CriticConfig(cameras=config.cameras, episode_limit=config.max_steps if config.time_input else 0,
                        actor_input=config.actor_input, plan_steps=config.plan_steps,
                        privileged_dim=privileged_dim)


def privileged_dim(config: TrainCriticConfig) -> int:
    """Size of the store's privileged state for a `--privileged` critic (0 without it); a clear error where the
    store records none."""
    if not config.privileged:
        return 0
    specs = open_episode_reader(config.data).specs
    if PRIVILEGED not in specs:
        raise ValueError(f"{config.data} records no privileged state (the env's `{PRIVILEGED}` observation), which "
                         "--privileged reads: record the episodes with an env that gives it (the tabletop does), or "
                         "leave --privileged off")
    return int(specs[PRIVILEGED][0][0])


def _held_out(ends: np.ndarray, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(training step indices, validation step indices, validation episodes): whole episodes held out."""
    n_ep = len(ends)
    rng = np.random.default_rng(seed)
    val_eps = rng.choice(n_ep, size=max(1, int(round(fraction * n_ep))), replace=False)
    starts = np.concatenate([[0], ends[:-1]])
    is_val = np.zeros(int(ends[-1]) if n_ep else 0, bool)
    for e in val_eps:
        is_val[starts[e] : ends[e]] = True
    return torch.from_numpy(np.flatnonzero(~is_val)), torch.from_numpy(np.flatnonzero(is_val)), len(val_eps)


def _distil(targets: torch.Tensor, config: TrainCriticConfig, data: dict, log: Log) -> None:
    """Targets at the states the branch sidecar values become their branch values (in place)."""
    table = BranchTable.load(config.branch_values)
    if int(table.meta["max_steps"]) != config.max_steps:
        raise ValueError(f"{config.branch_values} normalises returns by {table.meta['max_steps']} steps, this "
                         f"critic by --max_steps {config.max_steps}")
    index, values = branch_targets(table, [m.episode_id for m in data["metas"]], data["episode_ends"])
    targets[torch.from_numpy(index)] = torch.from_numpy(values)
    log(f"{len(index)} states take their branch value as the target ({config.branch_values})")


def fit_critic(config: TrainCriticConfig, init_policy: str | None = None, log: Log = print) -> dict:
    """Train (or resume) the critic of `config.out`; `init_policy`: a policy checkpoint whose encoders a fresh
    critic starts from (default `config.init_policy`). Returns a summary."""
    ckpt = open_run(config.out, kind=KIND, resume=config.loop.resume, seed=config.loop.seed,
                    threads=config.loop.threads)
    model_config = _model_config(config, ckpt, privileged_dim(config) if not ckpt else 0)
    model = ValueCritic(model_config)
    init_path = config.init_policy if init_policy is None else init_policy
    # a fresh run may start its encoders from a policy's (read first: a bad path fails before the data loads)
    init = load_policy(init_path) if init_path and not ckpt else None
    data = load_training_arrays(config.data, model_config.cameras, model.tokenizer,
                                privileged=bool(model_config.privileged_dim))
    if model_config.actor_input and not ckpt and len(np.unique(data["actors"])) < 2:
        # one actor only (demonstrations before any rollout): there is nothing to tell apart, and an input
        # the critic never saw vary would be asked at run time for an actor it never saw
        log("every episode has the same actor: this critic is trained without the actor input")
        model_config = dataclasses.replace(model_config, actor_input=False)
        torch.manual_seed(config.loop.seed)
        model = ValueCritic(model_config)
    successes = [m.success for m in data["metas"]]
    targets = torch.from_numpy(value_targets(data["rewards"], data["episode_ends"], successes, config.max_steps))
    if config.branch_values:
        _distil(targets, config, data, log)
    images = {k: torch.from_numpy(v) for k, v in data["images"].items()}
    states, tokens = torch.from_numpy(data["states"]), torch.from_numpy(data["tokens"])
    privileged = torch.from_numpy(data["privileged"]) if model_config.privileged_dim else None
    steps, actors = torch.from_numpy(data["episode_steps"]), torch.from_numpy(data["actors"])
    plan_steps = model_config.plan_steps
    if plan_steps and data["actions"].shape[1] != model_config.action_dim:
        raise ValueError(f"{config.data} records {data['actions'].shape[1]}-d actions; the critic's plan "
                         f"takes {model_config.action_dim}-d ones")
    plans = torch.from_numpy(executed_plans(data["actions"], data["episode_ends"], plan_steps)) if plan_steps else None
    n_ep = len(data["episode_ends"])
    train_idx, val_idx, n_val = _held_out(data["episode_ends"], config.val_fraction, config.loop.seed)
    if not len(train_idx):
        raise SystemExit("error: no training steps left after the validation split; record more episodes")
    fit = start_fit(config.out, KIND, model, ckpt, loop_config(config.loop), config.loop.seed, log)
    if not ckpt:
        model.set_normalization(states[train_idx], privileged[train_idx] if privileged is not None else None)
        if init is not None:
            log(f"encoders {', '.join(model.load_backbone(init))} from {init_path}")
    n_policy = int(np.sum(data["actors"][data["episode_ends"] - 1] == ACTOR_POLICY))  # one step per episode
    log(f"critic: {fit.parameters / 1e6:.2f} M parameters; {n_ep} episodes ({n_val} held out; "
        f"{n_ep - n_policy} demonstrations, {n_policy} rollouts" + (", told apart" if model_config.actor_input else "")
        + ")")
    generator = fit.generator

    def loss_fn(step: int) -> torch.Tensor:
        idx = train_idx[torch.randint(0, len(train_idx), (config.loop.batch_size,), generator=generator)]
        imgs = {k: random_shift(v[idx], config.shift, generator) if config.shift else v[idx] for k, v in images.items()}
        plan = None
        if plans is not None:  # hide some plans: the same critic learns the state's value too
            plan = plans[idx].clone()
            plan[torch.rand(len(idx), generator=generator) < config.plan_dropout] = float("nan")
        priv = None
        if privileged is not None:  # blurred by --privileged_noise, in units of each number's spread
            priv = privileged[idx]
            if config.privileged_noise:
                priv = priv + config.privileged_noise * model.privileged_std * torch.randn(
                    priv.shape, generator=generator)
        return model.loss(imgs, states[idx], model.embed_language(tokens[idx]), targets[idx], steps[idx], actors[idx],
                          plan, priv)

    def evaluate(step: int) -> dict:
        """Held-out loss and value error; a plan critic's with the plans given and, `_state_only`, without."""
        modes = {"": True, "_state_only": False} if plans is not None else {"": False}
        out = {}
        for suffix, with_plan in modes.items():
            losses, errors = [], []
            for chunk in torch.split(val_idx, 512):
                logits = model.logits({k: v[chunk] for k, v in images.items()}, states[chunk],
                                      model.embed_language(tokens[chunk]), steps[chunk], actors[chunk],
                                      plans[chunk] if with_plan else None,
                                      privileged[chunk] if privileged is not None else None)
                losses.append(float(model.loss_from_logits(logits, targets[chunk])) * len(chunk))
                errors.append((model.value(logits) - targets[chunk]).abs())
            out[f"val_loss{suffix}"] = sum(losses) / len(val_idx)
            out[f"val_value_mae{suffix}"] = float(torch.cat(errors).mean())
        return out

    info = {"data": config.data, "episodes": n_ep}
    seconds = fit.run(loss_fn, evaluate, lambda step: fit.save(step, config=run_config(model_config, model.tokenizer,
                                                                                       config), info=info),
                      desc="train_critic")
    return {"checkpoint": str(config.out), "parameters": fit.parameters, "steps": config.loop.steps,
            "resumed_from": fit.start, "train_seconds": seconds, "episodes": n_ep, "evals": fit.evals}
