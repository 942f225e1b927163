"""Tiny model configs so tests run in milliseconds."""

import torch

from capsule_rollout.tabletop.flow_policy import FlowPolicy, FlowPolicyConfig
from capsule_rollout.tabletop.value_critic import CriticConfig, ValueCritic

TINY_POLICY = FlowPolicyConfig(image_size=16, channels=(8, 8, 8), vision_dim=16, lang_dim=16, cond_dim=32,
                               hidden=32, blocks=1, chunk_length=4, denoise_steps=3, time_dim=8)
TINY_CRITIC = CriticConfig(image_size=16, channels=(8, 8, 8), vision_dim=16, lang_dim=16, hidden=32, bins=21,
                           episode_limit=80)


def obs_of(images: dict, state) -> dict:
    """An env-style observation (`image_<camera>`, `state`) from images by camera and a state."""
    return {**{f"image_{camera}": image for camera, image in images.items()}, "state": state}


def tiny_policy(seed: int = 0) -> FlowPolicy:
    import torch

    torch.manual_seed(seed)
    return FlowPolicy(TINY_POLICY)


def tiny_critic(seed: int = 0) -> ValueCritic:
    import torch

    torch.manual_seed(seed)
    return ValueCritic(TINY_CRITIC)


def save_tiny_checkpoints(directory, seed: int = 0) -> tuple[str, str]:
    """Tiny policy and critic checkpoints (random weights) under `directory`; returns their paths."""
    from pathlib import Path

    from capsule_rollout.models.checkpoint import save_checkpoint
    from capsule_rollout.tabletop.flow_policy import KIND as POLICY_KIND
    from capsule_rollout.tabletop.value_critic import KIND as CRITIC_KIND

    directory = Path(directory)
    policy, critic = directory / "policy", directory / "critic"
    save_checkpoint(policy, kind=POLICY_KIND, model=tiny_policy(seed), step=0, config={"model": TINY_POLICY.to_json()})
    save_checkpoint(critic, kind=CRITIC_KIND, model=tiny_critic(seed), step=0, config={"model": TINY_CRITIC.to_json()})
    return str(policy), str(critic)


def random_obs(config, seed: int) -> dict:
    """An observation for a model of `config`: random uint8 images of its cameras and a random state, from `seed`."""
    g = torch.Generator().manual_seed(seed)
    obs = {f"image_{c}": torch.randint(0, 256, (config.image_size, config.image_size, 3), dtype=torch.uint8,
                                       generator=g) for c in config.cameras}
    obs["state"] = torch.randn(config.state_dim, generator=g)
    return obs
