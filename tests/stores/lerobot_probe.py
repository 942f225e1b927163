"""Run by LeRobot's own venv (not the project's): open an exported dataset with `LeRobotDataset` and dump
what it returns, for tests/stores/test_lerobot_loader.py to compare with the store.

usage: python lerobot_probe.py ROOT BACKEND HORIZON OUT.npz   (BACKEND: torchcodec, pyav, or - for images)
Exit code 3: the backend cannot run here (the message says why).
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch


def main() -> int:
    root, backend, horizon, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    if backend == "torchcodec":
        try:
            import torchcodec.decoders  # noqa: F401 - loads the system's FFmpeg libraries
        except (ImportError, RuntimeError, OSError) as exc:
            print(f"torchcodec cannot load FFmpeg here: {str(exc).splitlines()[0]}")
            return 3
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    info = json.loads((root / "meta/info.json").read_text())
    fps = info["fps"]
    camera = next(k for k, ft in info["features"].items() if ft["dtype"] in ("video", "image"))
    dataset = LeRobotDataset("capsule-rollout/export", root=root, video_backend=None if backend == "-" else backend,
                             delta_timestamps={"action": [k / fps for k in range(horizon)], camera: [-1 / fps, 0.0]})
    items = [dataset[i] for i in range(len(dataset))]
    images = (torch.stack([it[camera] for it in items]) * 255).round().to(torch.uint8)  # (N, 2, C, H, W)
    arrays = {
        "state": torch.stack([it["observation.state"] for it in items]),
        "action_chunk": torch.stack([it["action"] for it in items]),
        "action_is_pad": torch.stack([it["action_is_pad"] for it in items]),
        "image": images[:, 1],
        "previous_image": images[:, 0],
        "previous_is_pad": torch.stack([it[f"{camera}_is_pad"][0] for it in items]),
        **{k: torch.stack([it[k] for it in items]) for k in
           ("episode_index", "frame_index", "index", "timestamp", "reward", "value", "intervention", "subtask_id")},
    }
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=False)))
    np.savez(out, **{k: v.numpy() for k, v in arrays.items()})
    out.with_suffix(".json").write_text(json.dumps({
        "lerobot": version("lerobot"), "torch": torch.__version__, "backend": dataset.video_backend,
        "camera": camera, "num_episodes": dataset.num_episodes, "num_frames": dataset.num_frames,
        "tasks": [it["task"] for it in items], "subtasks": [it["subtask"] for it in items],
        "stats_keys": sorted(dataset.meta.stats), "batch_action_shape": list(batch["action"].shape),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
