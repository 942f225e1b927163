"""`LeRobotModel`: a LeRobot `PreTrainedPolicy` loaded from a local directory with its processors, called on rows.

A LeRobot checkpoint directory (what `lerobot-train` saves as `checkpoints/<step>/pretrained_model`) holds
`config.json` (the policy's type and features), `model.safetensors` and the processor pipelines
(`policy_preprocessor.json`, `policy_postprocessor.json` and their normalisation stats). LeRobot is an optional
extra in a venv of its own (it pins its torch): it is imported when a model is loaded, never at module import.

    model.chunk_rows(history, generators) -> (N, n_action_steps, A) float32

`history[feature]` is `(N, n_obs_steps, ...)` as the env gives it (images `(H, W, 3)` uint8, the state float32),
the oldest first; each row is made as LeRobot's own evaluation makes it (images to `(3, H, W)` float32 in [0, 1]),
run through the checkpoint's preprocessor, the network and its postprocessor: the actions come back unnormalised,
`n_action_steps` of them from the current step on (what `select_action` would hand out one by one). Randomness
comes only from `generators` (one `torch.Generator` per row): Diffusion Policy's initial noise and every DDPM step's
noise are drawn from the row's own generator (diffusers draws a batch row by row from a list of generators), so a
row's chunk depends on its generator, its history and the batch size, not on the other rows; ACT samples nothing
at inference (its latent is zero outside training).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from capsule_rollout.capsules.fingerprint import module_sha256

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INSTALL = ("pip install lerobot==0.4.4 in a venv of its own beside this project (`make lerobot-venv` builds "
           ".venv-lerobot: LeRobot 0.4.4 and this project, LeRobot's torch left as it is)")
SUPPORTED = ("act", "diffusion")
"""LeRobot policy types this adapter runs: ACT (an action queue) and Diffusion Policy (an observation history, an
action queue and sampled noise). Others (VQ-BeT, TD-MPC, pi0, SmolVLA...) keep other state or draw their noise
from torch's global generator, which a row's capsule could not hold."""
OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
OBS_IMAGES = "observation.images"  # Diffusion's stacked cameras
VISUAL = "VISUAL"


def is_lerobot_checkpoint(path: str | Path) -> bool:
    """Whether `path` holds a LeRobot policy as `save_pretrained` writes it (config.json with a `type`, weights)."""
    path = Path(path)
    if not ((path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()):
        return False
    try:
        return isinstance(json.loads((path / CONFIG_FILE).read_text()).get("type"), str)
    except (ValueError, AttributeError):
        return False


def read_config(path: str | Path) -> dict:
    """The checkpoint's `config.json` (read as JSON: no LeRobot needed), checked for a type this adapter runs."""
    config = json.loads((Path(path) / CONFIG_FILE).read_text())
    kind = config.get("type")
    if kind not in SUPPORTED:
        raise ValueError(f"{path} is a LeRobot {kind!r} policy; this adapter runs {', '.join(SUPPORTED)} (their state "
                         "between calls is a history and an action queue it keeps per slot)")
    if kind == "act" and config.get("temporal_ensemble_coeff") is not None:
        raise ValueError(f"{path}: ACT with temporal ensembling calls the network every step and averages chunks; "
                         "this adapter runs ACT with an action queue (temporal_ensemble_coeff null)")
    return config


def require_lerobot(path: str | Path) -> None:
    """ImportError in one line, with the command that installs it, when LeRobot is not importable here."""
    try:
        import lerobot  # noqa: F401
    except ImportError:
        raise ImportError(f"{path} is a LeRobot policy and LeRobot is not installed in this Python: {INSTALL}") \
            from None


def _files_sha256(directory: Path) -> str:
    """The checkpoint's processor files (their normalisation stats change every action)."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("policy_*processor*")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class LeRobotModel:
    """A LeRobot policy of a `SUPPORTED` type, loaded from `path` on `device`; `keys`: LeRobot's input feature ->
    the env's observation key it is read from (every input feature named)."""

    loaded = 0
    """Models loaded in this process (tests and reports count instances with it)."""

    def __init__(self, path: str | Path, keys: Mapping[str, str], *, device: str = "cpu") -> None:
        self.path = Path(path)
        self.config_json = read_config(self.path)
        require_lerobot(self.path)
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        config = PreTrainedConfig.from_pretrained(self.path)
        config.device = str(device)
        if hasattr(config, "pretrained_backbone_weights"):
            config.pretrained_backbone_weights = None  # the trained backbone is in model.safetensors: no download
        self.type = config.type
        self.config = config
        self.policy = get_policy_class(config.type).from_pretrained(self.path, config=config).eval()
        device_override = {"device_processor": {"device": str(device)}}
        self.preprocessor, self.postprocessor = make_pre_post_processors(
            config, pretrained_path=str(self.path), preprocessor_overrides=device_override)
        self.device = torch.device(device)
        features = dict(config.input_features)
        missing = sorted(set(features) - set(keys))
        if missing:
            raise ValueError(f"{path}: no env observation key is given for LeRobot feature(s) {missing}")
        self.keys = {feature: keys[feature] for feature in features}
        self.visual = tuple(f for f, ft in features.items() if ft.type.value == VISUAL)
        self.shapes = {f: tuple(ft.shape) for f, ft in features.items()}
        self.action_dim = int(config.output_features["action"].shape[0])
        self.n_obs_steps = int(config.n_obs_steps)
        self.n_action_steps = int(config.n_action_steps)
        self.samples = self.type == "diffusion"
        if self.type == "act" and self.n_obs_steps != 1:
            raise ValueError(f"{path}: ACT reads the current observation only (n_obs_steps 1), got {self.n_obs_steps}")
        self.fingerprint = {"kind": "lerobot", "type": self.type, "weights_sha256": module_sha256(self.policy),
                            "processors_sha256": _files_sha256(self.path),
                            "history": str(self.n_obs_steps), "queue": f"{self.n_action_steps}x{self.action_dim}",
                            "reads": ",".join(f"{f}<-{k}" for f, k in self.keys.items())}
        type(self).loaded += 1

    def env_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """env key -> (shape, dtype) of the observations read: an image `(H, W, 3)` uint8 for a `(3, H, W)`
        feature, any other feature's shape as float32."""
        shapes = {}
        for feature, key in self.keys.items():
            shape = self.shapes[feature]
            if feature in self.visual:
                if len(shape) != 3 or shape[0] != 3:
                    raise ValueError(f"{self.path}: {feature} is {shape}; this adapter reads RGB images (3, H, W)")
                shapes[key] = ((shape[1], shape[2], 3), np.dtype(np.uint8))
            else:
                shapes[key] = (shape, np.dtype(np.float32))
        return shapes

    def _frames(self, history: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every history frame as LeRobot's evaluation feeds it, preprocessed: feature -> (N, n_obs, ...)."""
        flat: dict[str, Any] = {}
        for feature, key in self.keys.items():
            frames = history[key]
            n, t = frames.shape[:2]
            if feature in self.visual:  # (H, W, 3) uint8 -> (3, H, W) float32 in [0, 1], as lerobot.envs.utils
                frames = frames.reshape(n * t, *frames.shape[2:]).permute(0, 3, 1, 2).contiguous()
                frames = frames.type(torch.float32) / 255
            else:
                frames = frames.reshape(n * t, *frames.shape[2:]).to(torch.float32)
            flat[feature] = frames
        processed = self.preprocessor(flat)
        return {f: processed[f].reshape(n, t, *processed[f].shape[1:]) for f in self.keys}

    @torch.no_grad()
    def chunk_rows(self, history: Mapping[str, torch.Tensor],
                   generators: list[torch.Generator] | None = None) -> torch.Tensor:
        """The next `n_action_steps` actions of every row `(N, n_action_steps, A)` float32 on the CPU (see the
        module docstring); `generators`: one per row (Diffusion), None for ACT."""
        frames = self._frames(history)
        if self.type == "act":
            actions = self.policy.predict_action_chunk({f: x[:, -1] for f, x in frames.items()})
            actions = actions[:, : self.n_action_steps]
        else:
            actions = self._diffusion(frames, generators)
        return self.postprocessor(actions).to("cpu", torch.float32)

    def _diffusion(self, frames: dict[str, torch.Tensor], generators: list[torch.Generator] | None) -> torch.Tensor:
        """`DiffusionModel.generate_actions` with a generator per row (its own draws the DDPM steps' noise from
        torch's global generator)."""
        if generators is None or len(generators) != next(iter(frames.values())).shape[0]:
            raise ValueError("Diffusion Policy samples: give one torch.Generator per row")
        model, config = self.policy.diffusion, self.config
        batch = {OBS_STATE: frames[OBS_STATE]}
        if self.visual:
            batch[OBS_IMAGES] = torch.stack([frames[f] for f in config.image_features], dim=-4)
        if config.env_state_feature:
            batch[OBS_ENV_STATE] = frames[OBS_ENV_STATE]
        n = batch[OBS_STATE].shape[0]
        global_cond = model._prepare_global_conditioning(batch)
        shape = (1, config.horizon, self.action_dim)
        dtype = next(model.parameters()).dtype
        noise = torch.cat([torch.randn(shape, generator=g, dtype=dtype) for g in generators]).to(self.device)
        sample = model.conditional_sample(n, global_cond=global_cond, generator=list(generators), noise=noise)
        start = self.n_obs_steps - 1
        return sample[:, start: start + self.n_action_steps]
