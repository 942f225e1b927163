"""Registry of named experiments: name -> default config + runner (imported lazily)."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from experiments.configs import (
    BenchBridgeConfig,
    BenchCapsulesConfig,
    BenchEnvConfig,
    BenchLeRobotConfig,
    BenchPolicyConfig,
    BenchRolloutConfig,
    CollectDemosConfig,
    EvalPolicyConfig,
    ExportCheckpointConfig,
    ExportLeRobotConfig,
    GpuCheckConfig,
    ImportLeRobotConfig,
    LabelAdvantagesConfig,
    RealRecapConfig,
    RecapConfig,
    ReplayConfig,
    ScanEnvConfig,
    SimRobotServerConfig,
    SimRolloutConfig,
    TrainCriticConfig,
    TrainPolicyConfig,
    TrainStatePolicyConfig,
    ValueCeilingConfig,
    VerifyCapsuleConfig,
)
from experiments.result import ExperimentResult


class UnknownExperimentError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Experiment:
    name: str
    config: Any  # the default config (a frozen dataclass instance)
    runner: str  # "module:function"; imported only when the experiment runs
    summary: str

    def load_runner(self) -> Callable[[Any], ExperimentResult]:
        module, func = self.runner.split(":")
        return getattr(importlib.import_module(module), func)


_REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> None:
    if experiment.name in _REGISTRY:
        raise ValueError(f"experiment {experiment.name!r} is registered twice")
    _REGISTRY[experiment.name] = experiment


def get(name: str) -> Experiment:
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise UnknownExperimentError(
            f"unknown experiment {name!r}; {hint}known: {', '.join(sorted(_REGISTRY))}"
        ) from None


def names() -> list[str]:
    return sorted(_REGISTRY)


register(
    Experiment(
        "verify_capsule",
        VerifyCapsuleConfig(),
        "experiments.verify_capsule:run",
        "Bit-exactness report for every capsule-bearing component (exits non-zero if any is not exact).",
    )
)
register(
    Experiment(
        "bench_capsules",
        BenchCapsulesConfig(),
        "experiments.bench_capsules:run",
        "Snapshot/restore latency vs a contiguous copy of the same bytes; disk save/load MB/s.",
    )
)
register(
    Experiment(
        "collect_demos",
        CollectDemosConfig(),
        "experiments.collect_demos:run",
        "Scripted-expert demonstrations to a zarr store or .npz files (resumable).",
    )
)
register(
    Experiment(
        "bench_env",
        BenchEnvConfig(),
        "experiments.bench_env:run",
        "Env steps/s (state-only, rendered), reset(seed) vs capsule restore, recorder MB/s and caller wait.",
    )
)
register(
    Experiment(
        "train_policy",
        TrainPolicyConfig(),
        "experiments.train_policy:run",
        "Train the flow policy on recorded episodes (resumable; closed-loop evaluation on held-out seeds).",
    )
)
register(
    Experiment(
        "train_critic",
        TrainCriticConfig(),
        "experiments.train_critic:run",
        "Train the distributional value critic on recorded episodes (resumable).",
    )
)
register(
    Experiment(
        "eval_policy",
        EvalPolicyConfig(),
        "experiments.eval_policy:run",
        "Success rate of a policy checkpoint on held-out seeds, next to the scripted expert's.",
    )
)
register(
    Experiment(
        "value_ceiling",
        ValueCeilingConfig(),
        "experiments.value_ceiling:run",
        "How predictable failure is mid-episode: policy branches from restored capsules vs a critic's failure AUC.",
    )
)
register(
    Experiment(
        "bench_policy",
        BenchPolicyConfig(),
        "experiments.bench_policy:run",
        "Policy and critic latency per chunk, serial vs two-lane, captured vs eager on a GPU.",
    )
)
register(
    Experiment(
        "sim_rollout",
        SimRolloutConfig(),
        "experiments.sim_rollout:run",
        "Policy + critic rollouts on Ray actors (capsule resets, hand-off), recorded to zarr; table, plot, video.",
    )
)
register(
    Experiment(
        "replay",
        ReplayConfig(),
        "experiments.replay:run",
        "Re-run a recorded episode from its initial capsule; exits non-zero unless actions and values are bit-identical.",
    )
)
register(
    Experiment(
        "export_checkpoint",
        ExportCheckpointConfig(),
        "experiments.export_checkpoint:run",
        "Copy a policy or critic checkpoint without optimizer state (the form that is shipped).",
    )
)
register(
    Experiment(
        "bench_rollout",
        BenchRolloutConfig(),
        "experiments.bench_rollout:run",
        "Reset by capsule restore vs cold, recording on vs off, 1 vs 2 actors, hand-off latency.",
    )
)
register(
    Experiment(
        "label_advantages",
        LabelAdvantagesConfig(),
        "experiments.label_advantages:run",
        "RECAP advantage labels (N-step, per-task thresholds, interventions positive) as a sidecar next to a store.",
    )
)
register(
    Experiment(
        "bench_bridge",
        BenchBridgeConfig(),
        "experiments.bench_bridge:run",
        "Robot bridge round-trip latency on loopback (heartbeat, action, observe) against the SimRobotServer.",
    )
)
register(
    Experiment(
        "real_recap",
        RealRecapConfig(),
        "experiments.real_recap:run",
        "RECAP rollouts on a robot through the bridge: operator END labels, takeover, coaching, e-stop; npz + zarr.",
    )
)
register(
    Experiment(
        "sim_robot_server",
        SimRobotServerConfig(),
        "experiments.sim_robot_server:run",
        "Serve the tabletop sim as a robot over the bridge protocol (for real_recap without hardware).",
    )
)
register(
    Experiment(
        "recap",
        RecapConfig(),
        "experiments.recap:run",
        "The RECAP loop in sim: BC baseline, then rollouts with takeovers, critic, advantage labels, conditioned policy.",
    )
)
register(
    Experiment(
        "gpu_check",
        GpuCheckConfig(),
        "experiments.gpu_check:run",
        "Every check of the CUDA path in one run (GPU tests, verify, benchmarks, GPU actors, replay); one JSON report.",
    )
)
register(
    Experiment(
        "export_lerobot",
        ExportLeRobotConfig(),
        "experiments.export_lerobot:run",
        "Export a store as a LeRobot v3.0 dataset (parquet frames, mp4 per camera, tasks, stats) for LeRobot's loader.",
    )
)
register(
    Experiment(
        "import_lerobot",
        ImportLeRobotConfig(),
        "experiments.import_lerobot:run",
        "Read a local LeRobot v3.0 dataset into a zarr store (train_policy can train on it; resumable).",
    )
)
register(
    Experiment(
        "bench_lerobot",
        BenchLeRobotConfig(),
        "experiments.bench_lerobot:run",
        "LeRobot export and import speed (frames/s) with and without video, and the dataset's size.",
    )
)

register(
    Experiment(
        "scan_env",
        ScanEnvConfig(),
        "experiments.scan_env:run",
        "hidden-state scan of a gymnasium MuJoCo env: candidate capture declarations",
    )
)
register(
    Experiment(
        "train_state_policy",
        TrainStatePolicyConfig(),
        "experiments.train_state_policy:run",
        "behaviour-clone a small state -> action-chunk network into a TorchPolicy checkpoint",
    )
)
