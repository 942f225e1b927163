"""How the core loads this example's checkpoints: the flow policy (`flow_policy`) and the value critic
(`value_critic`), registered under the entry-point group `capsule_rollout.checkpoints` (pyproject.toml), as a
user's package registers its own kinds (`rollout.sources`)."""

from __future__ import annotations

from capsule_rollout.models.checkpoint import Checkpoint
from capsule_rollout.policies.conditioning import Conditioning
from capsule_rollout.rollout.sources import Described, Loaded
from capsule_rollout.tabletop import flow_policy, value_critic
from capsule_rollout.tabletop.critic_runtime import CriticRuntime
from capsule_rollout.tabletop.policy_runtime import PolicyRuntime


def _only(role: str, wanted: str, path: str) -> None:
    if role != wanted:
        raise ValueError(f"{path} is a {wanted} checkpoint; it cannot serve as the {role}")


class FlowPolicyLoader:
    def describe(self, path: str) -> Described:
        config = flow_policy.FlowPolicyConfig.from_json(Checkpoint(path, kind=flow_policy.KIND).config["model"])
        return Described(chunk_length=config.chunk_length, image_size=config.image_size, takes_conditioning=True,
                         takes_noise_scale=True)

    def load(self, path: str, *, role: str, device: str, conditioning: Conditioning, noise_scale: float) -> Loaded:
        _only(role, "policy", path)
        model = flow_policy.load_policy(path, device)
        runtime = PolicyRuntime(model, device=device, guidance=conditioning.beta is not None, noise_scale=noise_scale)
        return Loaded(runtime, tuple(model.config.cameras), model.config.image_size, conditioning)


class ValueCriticLoader:
    def describe(self, path: str) -> Described:
        config = value_critic.CriticConfig.from_json(Checkpoint(path, kind=value_critic.KIND).config["model"])
        return Described(image_size=config.image_size)

    def load(self, path: str, *, role: str, device: str, conditioning: Conditioning, noise_scale: float) -> Loaded:
        _only(role, "critic", path)
        model = value_critic.load_critic(path, device)
        return Loaded(CriticRuntime(model, device=device), tuple(model.config.cameras), model.config.image_size)


FLOW_POLICY = FlowPolicyLoader()
VALUE_CRITIC = ValueCriticLoader()
