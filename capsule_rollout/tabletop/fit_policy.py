"""fit_policy: flow-matching behaviour cloning from a store of episodes (RECAP-conditioned when labels are
given), resumable, evaluated on held-out seeds as it goes."""

from __future__ import annotations

import numpy as np
import torch

from capsule_rollout.learning.advantage_labels import load_sidecar
from capsule_rollout.learning.options import TrainPolicyConfig
from capsule_rollout.learning.policy_data import action_labels, load_training_arrays
from capsule_rollout.learning.training import Log, loop_config, open_run, run_config, start_fit
from capsule_rollout.models.checkpoint import Checkpoint
from capsule_rollout.policies.chunk_dataset import ChunkDataset, subgoal_targets
from capsule_rollout.policies.conditioning import CONDITIONING_INFO, Conditioning
from capsule_rollout.tabletop.encoders import random_shift
from capsule_rollout.tabletop.flow_policy import ADV_NONE, KIND, FlowPolicy, FlowPolicyConfig
from capsule_rollout.tabletop.phrasing import phrasings as phrase_all
from capsule_rollout.tabletop.tabletop_eval import evaluate_policy
from capsule_rollout.tabletop.tasks import FAMILY_NAMES


def _model_config(config: TrainPolicyConfig) -> FlowPolicyConfig:
    return FlowPolicyConfig(cameras=config.cameras, chunk_length=config.chunk_length,
                            denoise_steps=config.denoise_steps, hidden=config.hidden)


def _dataset(config: TrainPolicyConfig, model: FlowPolicy, advantage: np.ndarray | None) -> ChunkDataset:
    model_config = model.config
    data = load_training_arrays(config.data, model_config.cameras, model.tokenizer)
    if advantage is None and config.advantage_labels:
        advantage = load_sidecar(config.advantage_labels, [m.episode_id for m in data["metas"]])
    phrasings = None
    if config.paraphrase:
        rows = [model.tokenizer.encode_batch(list(phrase_all(text, "train"))) for text in data["texts"]]
        width = max(len(r) for r in rows)
        table = np.stack([np.concatenate([r, r[np.arange(width - len(r)) % len(r)]]) for r in rows])
        phrasings = (data["text_ids"], table)
    subgoals = (subgoal_targets(data["states"], data["subtask_ids"], data["episode_ends"], model_config.subgoal_dim)
                if model_config.subgoal_dim else None)
    return ChunkDataset(images=data["images"], states=data["states"], actions=action_labels(data, config.labels),
                        tokens=data["tokens"], episode_ends=data["episode_ends"],
                        chunk_length=model_config.chunk_length, advantage=advantage, subgoals=subgoals,
                        phrasings=phrasings)


def fit_policy(config: TrainPolicyConfig, advantage: np.ndarray | None = None, log: Log = print) -> dict:
    """Train (or resume) the policy of `config.out`; `advantage`: per-step indicators (RECAP labels) aligned
    with the store's steps, or None (then `config.advantage_labels`' sidecar, if named). Returns a summary."""
    ckpt = open_run(config.out, kind=KIND, resume=config.loop.resume, seed=config.loop.seed,
                    threads=config.loop.threads)
    init = Checkpoint(config.init, kind=KIND) if config.init and not ckpt else None
    model_config = FlowPolicyConfig.from_json((ckpt or init).config["model"]) if ckpt or init else _model_config(config)
    model = FlowPolicy(model_config)
    dataset = _dataset(config, model, advantage)
    labelled = advantage is not None or bool(config.advantage_labels)
    fit = start_fit(config.out, KIND, model, ckpt, loop_config(config.loop), config.loop.seed, log)
    if init and not ckpt:
        init.load_model(model)  # weights and normalisation buffers
        log(f"starting from {config.init}")
    elif not ckpt:
        model.set_normalization(dataset.states, dataset.actions)
    log(f"policy: {fit.parameters / 1e6:.2f} M parameters; {dataset.n_episodes} episodes, {len(dataset)} steps")
    generator = fit.generator

    def loss_fn(step: int) -> torch.Tensor:
        batch = dataset.batch(torch.randint(0, len(dataset), (config.loop.batch_size,), generator=generator),
                              paraphrase=config.paraphrase, generator=generator)
        images = {k: random_shift(v, config.shift, generator) if config.shift else v for k, v in batch["images"].items()}
        adv = batch["advantage"]
        drop = torch.rand(adv.shape, generator=generator) < config.advantage_dropout
        adv = torch.where(drop, torch.full_like(adv, ADV_NONE), adv)
        return model.loss(images, batch["state"], model.embed_language(batch["tokens"]), adv, batch["actions"],
                          samples_per_example=config.noise_samples, generator=generator,
                          subgoal=batch.get("subgoal"), subgoal_weight=config.subgoal_weight)

    seeds = list(config.eval.range)

    def evaluate(step: int) -> dict:
        if not seeds:
            return {}
        if config.eval_family != "all":
            result = evaluate_policy(model, family=config.eval_family, seeds=seeds, n_exec=config.n_exec)
            return {"success_rate": result["success_rate"], "mean_steps_to_success": result["mean_steps_to_success"]}
        rates = {family: evaluate_policy(model, family=family, seeds=seeds, n_exec=config.n_exec)["success_rate"]
                 for family in FAMILY_NAMES}
        return {"success_rate": float(np.mean(list(rates.values()))),
                **{f"success_rate_{family}": rate for family, rate in rates.items()}}

    # trained with RECAP labels: deployed with the positive indicator (recap adds its guidance weight)
    conditioning = {CONDITIONING_INFO: Conditioning("positive").to_json()} if labelled else {}
    info = {"data": config.data, "episodes": dataset.n_episodes, "steps": len(dataset), **conditioning}
    seconds = fit.run(loss_fn, evaluate, lambda step: fit.save(step, config=run_config(model_config, model.tokenizer,
                                                                                       config), info=info),
                      desc="train_policy")
    evals = fit.evals
    return {"checkpoint": str(config.out), "parameters": fit.parameters, "steps": config.loop.steps,
            "resumed_from": fit.start, "train_seconds": seconds, "episodes": dataset.n_episodes, "evals": evals,
            "final_success_rate": evals[-1].get("success_rate") if evals else None}
