"""Preflight: a run's env, policy and critic built once in the driver, before any actor starts, and every
contract checked on a real observation, so that a run that cannot work fails in seconds with one line naming
the user's object (and the user's own frames), not at actor start in a Ray traceback.

What is checked: the sources build (each factory called, each checkpoint loaded); the env resets on the run's
first seed; one `infer` (or forward) and one `value` answer on that observation (the chunk's shape, dtype and
finiteness; the value one finite number: `policies.infer_policy.answer_chunks`, `critics.infer_critic
.answer_value`); the env takes one step with the chunk's first action; the policy's chunk holds `n_exec`
actions. `n_exec` not given defaults to the policy's chunk length for a factory's policy (what it plans is
what it executes). The probe runs on the CPU, on one slot (a batching object's `infer_batch` is checked the same
way in the episodes), with no observers, no capsule files and the caller's process left as it was found
(`rollout.process_state`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from capsule_rollout.envs.describe import describe_env
from capsule_rollout.envs.rollout_env import action_bounds
from capsule_rollout.rollout.host_config import SafetyStop
from capsule_rollout.rollout.host_factory import FACTORY, RunSpec, build_host, env_for_task, source_kind
from capsule_rollout.rollout.process_state import kept_process_state
from capsule_rollout.user_code import UserCodeError, describe, join, name_of

__all__ = ["Preflight", "PreflightError", "preflight"]


class PreflightError(ValueError):
    """A run refused before any actor started: `message` (one line, naming the user's object and what to do)
    and the user's own traceback frames under it (`str()` holds both, as the command line prints them)."""

    def __init__(self, message: str, frames: str = "") -> None:
        super().__init__(join(message, frames))
        self.message, self.frames = message, frames


@dataclass(frozen=True)
class Preflight:
    """What the probe found: the spec to run (its `n_exec` resolved), the policy's chunk, what the env says of
    itself, and warnings for the console (a run that would report nothing useful)."""

    spec: RunSpec
    chunk_length: int
    action_dim: int
    policy: str  # the user's object, by name (`Chunk4`, `FlowPolicy`)
    warnings: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)  # what the env says of itself (`envs.describe_env`), kept with the store


def preflight(spec: RunSpec, *, seed: int = 0, task: str = "", n_exec_given: bool = True) -> Preflight:
    """Build `spec`'s host once here and probe it on `seed` (of `task` in a `suite:*` run); raise
    `PreflightError` (a `ValueError`) saying what is wrong, or return what was found. `n_exec_given`: whether
    `spec.host.n_exec` was asked for (else, for a factory's policy, the chunk length is used)."""
    probe = dataclasses.replace(spec, env=env_for_task(spec.env, task), capsule_dir="", observers=(), slots=1,
                                env_threads=1, threads=0, pin_cores=False, takeover=(), device="cpu",
                                host=dataclasses.replace(spec.host, n_exec=1, value_threshold=None))
    with kept_process_state():
        host = _build(probe)
        try:
            policy = _policy_name(host.policy)
            info = _probe(host, probe, seed)
            chunk = int(host.policy.spec.chunk_length)
            action_dim = int(action_bounds(host.env)[0].shape[0])
            warnings = tuple(_warnings(host, probe, info))
            described = describe_env(host.env)
        finally:
            host.close()
    n_exec = spec.host.n_exec
    if not n_exec_given and source_kind(spec.policy) == FACTORY:
        n_exec = chunk
    elif n_exec > chunk:
        unset = ", or leave it unset (a factory's policy then executes its whole chunk)" if source_kind(
            spec.policy) == FACTORY else ""
        raise PreflightError(f"n_exec {n_exec} exceeds the chunk length of {policy} ({spec.policy}), {chunk} "
                             f"actions: pass --act.n_exec {chunk} or less{unset}")
    resolved = dataclasses.replace(spec, host=dataclasses.replace(spec.host, n_exec=n_exec))
    return Preflight(resolved, chunk, action_dim, policy, warnings, described)


def _build(spec: RunSpec):
    try:
        return build_host(spec, observers=[])
    except UserCodeError as exc:
        raise PreflightError(exc.message, exc.frames) from exc
    except (ValueError, FileNotFoundError, TypeError, ImportError):
        raise  # the project's own checks: their message says what to do
    except Exception as exc:
        line, frames = describe(exc)
        raise PreflightError(f"building the host of env {spec.env!r} with policy {spec.policy!r} raised {line}",
                             frames) from exc


def _probe(host, spec: RunSpec, seed: int) -> dict:
    """Reset on `seed`, one control step (the policy's and critic's calls included); the step's info."""
    env = spec.env
    try:
        _, _, _, obs = host.reset(seed)
    except Exception as exc:
        line, frames = describe(exc)
        raise PreflightError(f"env {env!r}: reset(seed={seed}) raised {line}", frames) from exc
    try:
        tick = host.tick(obs if obs is not None else host.env.observe())
    except UserCodeError as exc:  # names the object and method already
        raise PreflightError(exc.message, exc.frames or describe(exc)[1]) from exc
    except SafetyStop as exc:  # a chunk the host refuses before it reaches the env (a non-finite action)
        raise PreflightError(f"{_policy_name(host.policy)} ({spec.policy}) on the first observation of seed {seed}: "
                             f"{exc}") from exc
    except Exception as exc:
        line, frames = describe(exc)
        raise PreflightError(f"env {env!r}, the first control step: {line}", frames) from exc
    return dict(tick.info or {})


def _policy_name(policy) -> str:
    """The user's object inside a wrapper (an `InferPolicy`'s object, a `TorchPolicy`'s module), by name."""
    for attr in ("obj", "module"):
        inner = getattr(policy, attr, None)
        if inner is not None:
            return name_of(inner)
    return name_of(policy)


def _warnings(host, spec: RunSpec, info: dict) -> list[str]:
    from capsule_rollout.envs.suites import parse_env_id
    from capsule_rollout.envs.suites.catalog import info_success

    suite, _ = parse_env_id(spec.env) if spec.env else (None, "")
    capture = getattr(host.env, "capture", None)
    if suite is None and getattr(capture, "success", None) is info_success and not (
            "success" in info or "is_success" in info):
        return [f"env {spec.env!r}: its step info has no `success` (or `is_success`) key, so every episode counts "
                "as a failure: return info['success'] from step"]
    return []
