"""train_policy: flow-matching behaviour cloning from a zarr store of episodes."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from experiments.configs import TrainPolicyConfig
from experiments.console import make_console
from experiments.policy_data import action_labels, load_training_arrays
from experiments.policy_eval import evaluate_policy
from experiments.result import ExperimentResult
from policies.chunk_dataset import ChunkDataset, subgoal_targets
from models.checkpoint import Checkpoint, open_training_dir, save_checkpoint
from models.encoders import random_shift
from models.trainer import LoopConfig, make_optimizer, train
from policies.flow_policy import ADV_NONE, CONDITIONING_INFO, KIND, Conditioning, FlowPolicy, FlowPolicyConfig


def _model_config(config: TrainPolicyConfig) -> FlowPolicyConfig:
    return FlowPolicyConfig(cameras=config.cameras, chunk_length=config.chunk_length, denoise_steps=config.denoise_steps,
                            hidden=config.hidden)


def run(config: TrainPolicyConfig, advantage: np.ndarray | None = None) -> ExperimentResult:
    """`advantage`: per-step indicators (RECAP labels) aligned with the store's steps, or None."""
    console = make_console()
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out)
    ckpt = open_training_dir(out, kind=KIND, resume=config.resume)
    torch.manual_seed(config.seed)
    init = Checkpoint(config.init, kind=KIND) if config.init and not ckpt else None
    if ckpt or init:
        model_config = FlowPolicyConfig.from_json((ckpt or init).config["model"])
    else:
        model_config = _model_config(config)
    model = FlowPolicy(model_config)
    data = load_training_arrays(config.data, model_config.cameras, model.tokenizer)
    if advantage is None and config.advantage_labels:
        from experiments.label_advantages import load_sidecar

        advantage = load_sidecar(config.advantage_labels, [m.episode_id for m in data["metas"]])
    dataset = ChunkDataset(images=data["images"], states=data["states"], actions=action_labels(data, config.labels),
                           tokens=data["tokens"],
                           episode_ends=data["episode_ends"], chunk_length=model_config.chunk_length, advantage=advantage,
                           subgoals=subgoal_targets(data["states"], data["subtask_ids"], data["episode_ends"],
                                                    model_config.subgoal_dim) if model_config.subgoal_dim else None)
    loop = LoopConfig(steps=config.steps, lr=config.lr, eval_every=config.eval_every,
                      checkpoint_every=config.checkpoint_every, progress=config.progress)
    optimizer = make_optimizer(model, loop)
    generator = torch.Generator().manual_seed(config.seed)
    start, history = 0, []
    if ckpt:
        ckpt.load_model(model)
        generator.set_state(ckpt.load_optimizer(optimizer)["generator"])
        start, history = ckpt.step, list(ckpt.meta["info"].get("evals", []))
        console.print(f"resuming {out} from step {start}")
    elif init:
        init.load_model(model)  # weights and normalisation buffers
        console.print(f"starting from {config.init}")
    else:
        model.set_normalization(dataset.states, dataset.actions)
    params = sum(p.numel() for p in model.parameters())
    console.print(f"policy: {params / 1e6:.2f} M parameters; {dataset.n_episodes} episodes, {len(dataset)} steps")

    def loss_fn(step: int) -> torch.Tensor:
        batch = dataset.batch(torch.randint(0, len(dataset), (config.batch_size,), generator=generator))
        images = {k: random_shift(v, config.shift, generator) if config.shift else v for k, v in batch["images"].items()}
        adv = batch["advantage"]
        drop = torch.rand(adv.shape, generator=generator) < config.advantage_dropout
        adv = torch.where(drop, torch.full_like(adv, ADV_NONE), adv)
        lang = model.embed_language(batch["tokens"])
        return model.loss(images, batch["state"], lang, adv, batch["actions"],
                          samples_per_example=config.noise_samples, generator=generator,
                          subgoal=batch.get("subgoal"), subgoal_weight=config.subgoal_weight)

    seeds = list(range(config.eval_seed, config.eval_seed + config.eval_episodes))

    def evaluate(step: int) -> dict:
        if not seeds:
            return {}
        result = evaluate_policy(model, family=config.eval_family, seeds=seeds, n_exec=config.n_exec)
        return {"success_rate": result["success_rate"], "mean_steps_to_success": result["mean_steps_to_success"]}

    evals: list[dict] = list(history)  # the trainer appends each evaluation

    def save(step: int) -> None:
        save_checkpoint(
            out, kind=KIND, model=model, step=step, optimizer=optimizer, extra_tensors={"generator": generator.get_state()},
            config={"model": model_config.to_json(), "tokenizer": model.tokenizer.to_json(),
                    "train": dataclasses.asdict(config)},
            info={"data": config.data, "episodes": dataset.n_episodes, "steps": len(dataset), "evals": evals,
                  # trained with RECAP labels: deployed with the positive indicator (recap adds its guidance weight)
                  **({CONDITIONING_INFO: Conditioning("positive").to_json()} if advantage is not None else {})},
        )

    t0 = time.perf_counter()
    train(model=model, optimizer=optimizer, loss_fn=loss_fn, config=loop, start_step=start, evaluate=evaluate,
          save=save, desc="train_policy", log=evals)
    summary = {
        "checkpoint": str(out),
        "parameters": params,
        "steps": config.steps,
        "resumed_from": start,
        "train_seconds": time.perf_counter() - t0,
        "episodes": dataset.n_episodes,
        "evals": evals,
        "final_success_rate": evals[-1].get("success_rate") if evals else None,
    }
    return ExperimentResult(summary)
