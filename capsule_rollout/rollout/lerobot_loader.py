"""How the core loads a LeRobot policy directory (`--policy outputs/train/.../checkpoints/last/pretrained_model`):
recognised by its files (LeRobot's `config.json` with a `type`, `model.safetensors`), no `checkpoint.json` needed.

The env's observation is mapped onto LeRobot's feature names as `export_lerobot` writes them (`state` ->
`observation.state`, `image_<camera>` -> `observation.images.<camera>`): a policy trained on an export reads the
env the export was recorded from, and the env renders the cameras it reads at the size it was trained on. LeRobot
itself is imported only when such a policy is loaded (`policies.lerobot_model`), never to describe one.
"""

from __future__ import annotations

from capsule_rollout.policies.conditioning import Conditioning
from capsule_rollout.policies.lerobot_model import VISUAL, LeRobotModel, read_config
from capsule_rollout.policies.lerobot_policy import LeRobotPolicy
from capsule_rollout.rollout.sources import Described, Loaded
from capsule_rollout.stores.episode_schema import IMAGE_PREFIX
from capsule_rollout.stores.lerobot_format import step_key

KIND = "lerobot"


def feature_keys(path: str, config: dict) -> dict[str, str]:
    """LeRobot input feature -> the env's observation key (the export's naming, read back)."""
    keys = {}
    for feature in config.get("input_features", {}):
        key = step_key(feature)
        if key is None:
            raise ValueError(f"{path} reads LeRobot feature {feature!r}, which no env observation maps onto (an "
                             "export gives observation.state and observation.images.<camera>): wrap the model "
                             "with policies.lerobot_policy.LeRobotPolicy(LeRobotModel(path, keys={...})) in a "
                             "factory of your own to name the observation it reads")
        keys[feature] = key
    return keys


def image_size(path: str, config: dict) -> int | None:
    """The side of the square images the policy reads (None: no camera)."""
    sizes = {tuple(ft["shape"][1:]) for ft in config.get("input_features", {}).values() if ft.get("type") == VISUAL}
    if not sizes:
        return None
    if len(sizes) > 1 or any(h != w for h, w in sizes):
        raise ValueError(f"{path} reads images of {sorted(sizes)} (height, width); the env renders square images "
                         "of one size")
    return sizes.pop()[0]


class LeRobotLoader:
    """LeRobot policy directories: a `LeRobotPolicy` acting one action per chunk (`n_exec` 1, as `select_action`)."""

    def describe(self, path: str) -> Described:
        config = read_config(path)
        feature_keys(path, config)
        return Described(chunk_length=1, image_size=image_size(path, config), n_exec=1)

    def load(self, path: str, *, role: str, device: str, conditioning: Conditioning, noise_scale: float) -> Loaded:
        if role != "policy":
            raise ValueError(f"{path} is a LeRobot policy; it cannot serve as the {role}")
        config = read_config(path)
        policy = LeRobotPolicy(LeRobotModel(path, feature_keys(path, config), device=device))
        cameras = tuple(k[len(IMAGE_PREFIX):] for k in policy.spec.observation_keys if k.startswith(IMAGE_PREFIX))
        return Loaded(policy, cameras, image_size(path, config))


LOADER = LeRobotLoader()
