"""The example's value critic as a `learning.advantage_labels.StoreCritic`: V(o_t) for every recorded step of a
store (batched, no augmentation), each step valued for whoever acted in its episode."""

from __future__ import annotations

import numpy as np
import torch

from capsule_rollout.capsules.fingerprint import module_sha256
from capsule_rollout.tabletop.value_critic import ValueCritic, load_critic


def critic_values(critic, data: dict, batch: int = 256) -> np.ndarray:
    """V(o_t) for every step of the arrays from `load_training_arrays`."""
    cams = critic.config.cameras
    out = []
    with torch.no_grad():
        for lo in range(0, len(data["states"]), batch):
            sl = slice(lo, lo + batch)
            lang = critic.embed_language(torch.from_numpy(data["tokens"][sl]))
            images = {c: torch.from_numpy(np.ascontiguousarray(data["images"][c][sl])) for c in cams}
            step = torch.from_numpy(data["episode_steps"][sl])
            actor = torch.from_numpy(data["actors"][sl])  # each step valued for whoever acted in its episode
            privileged = (torch.from_numpy(data["privileged"][sl]) if critic.config.privileged_dim else None)
            out.append(critic.value(critic.logits(images, torch.from_numpy(data["states"][sl]), lang, step,
                                                  actor, None, privileged)).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


class StoreValues:
    """A `ValueCritic` (or its checkpoint directory) valuing a store's steps for RECAP labels."""

    def __init__(self, critic: ValueCritic | str) -> None:
        self.critic = load_critic(critic) if isinstance(critic, str) else critic
        self.cameras = tuple(self.critic.config.cameras)
        self.privileged = bool(self.critic.config.privileged_dim)  # it reads the steps' privileged state too
        self.tokenizer = self.critic.tokenizer

    def store_values(self, data: dict) -> np.ndarray:
        return critic_values(self.critic, data)

    def weights_sha256(self) -> str:
        return module_sha256(self.critic)
