"""What a user brings, written down: the env, the policy and the critic a run is built from, each member's meaning
and default. The project's own parts (`policies.rollout_policy.RolloutPolicy`, `critics.rollout_critic
.RolloutCritic`, `envs.rollout_env.RolloutEnv`) are what these are wrapped into; a user writes only what is here.

`check_policy(obj)` and `check_critic(obj)` name the first member that is missing or of the wrong kind, in one line
(`user_code.ContractError`): the preflight (`rollout.preflight`) runs them, and every other way of building a host
(`rollout.sources.as_rollout_policy`, `as_rollout_critic`), before anything is played. What a call answers (a chunk
of the wrong shape, a value that is no number) is checked on every call (`policies.infer_policy.answer_chunks`,
`critics.infer_critic.answer_value`).

Shapes: `obs` holds each observation key the object reads, as the env gives it, without a batch dimension: `state`
`(D,)` float32, `image_<camera>` `(H, W, 3)` uint8, the env's own `observation` (or its leaves
`observation.<key>`), and `prompt` (str) when a planner or instruction has handed one over. A chunk is `(T, A)`
float: `T` actions of the env's action dimension `A`.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from capsule_rollout.user_code import ContractError

__all__ = ["BatchPolicy", "Critic", "Env", "Policy", "StatefulPolicy", "check_critic", "check_policy"]


@runtime_checkable
class Policy(Protocol):
    """A policy: one method, `infer`; every other member is optional, with the default said.

    - `infer(obs, *, noise)`: the next action chunk `(T, A)`, answered as an array (or a tensor; a dict whose
      `actions` is the chunk, openpi's answer, is taken too); `noise` `(T, A)`
      standard normals drawn from the capsule's generator: a sampling policy starts from it, so a restore replays
      it. An `infer` without `noise` must be `deterministic` (the same obs always gives the same chunk).
    - `chunk_length: int` (>= 1): `T`. Default: asked once of a deterministic `infer` on a zero observation.
    - `observation_keys: Sequence[str]`: the env's keys `infer` reads. Default: every key the env gives.
    - `key_map: Mapping[str, str]`: {the name `infer` reads: the env's key, or `prompt`}. Default: none.
    - `deterministic: bool`: `infer` takes no `noise` and needs none. Default False.
    - `stateless: bool`: it keeps nothing across calls (its object graph is not captured). Default False: what it
      keeps (a history, an action queue) is captured with nothing declared.
    - `reset()`: called with no argument at every episode start. Default: nothing.
    - `get_state() -> Any`, `set_state(state)`: both or neither: what it keeps, as data (numbers, strings, arrays
      and containers of them), instead of its captured object graph.
    - `infer_batch(obs, *, noise) -> (N, T, A)`: `obs` with a leading batch of N rows: one call for a host's N slots.
    """

    def infer(self, obs: Mapping[str, Any], *, noise: Any = None) -> Any: ...


@runtime_checkable
class BatchPolicy(Policy, Protocol):
    """A policy that answers a host's slots in one call (`infer_batch`): keeps no episode state of its own."""

    def infer_batch(self, obs: Mapping[str, Any], *, noise: Any = None) -> Any: ...


@runtime_checkable
class StatefulPolicy(Policy, Protocol):
    """A policy that says what it keeps across calls, as data."""

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


@runtime_checkable
class Critic(Protocol):
    """A value critic: `value(obs) -> float`, the expected return from `obs`. Optional: `value_batch(obs) -> (N,)`
    over a leading batch of N rows, `observation_keys`, `key_map` and `reset()` as a policy's."""

    def value(self, obs: Mapping[str, Any]) -> float: ...


@runtime_checkable
class Env(Protocol):
    """An env as gymnasium has it (`gymnasium.Env`, made by `gymnasium.make` with its default wrappers, or a
    factory's): `reset(seed=, options=) -> (obs, info)`, `step(action) -> (obs, reward, terminated, truncated,
    info)`, `action_space` (a `Box`), `observation_space`. `info["success"]` (or `is_success`) in a step's info
    says the episode succeeded; without it every episode counts as a failure (the preflight warns). A MuJoCo env
    is captured with nothing declared (its `MjData` and its Python object graph)."""

    action_space: Any
    observation_space: Any

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]: ...

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]: ...


_OPTIONAL_CALLS = {"policy": ("infer_batch", "reset", "get_state", "set_state"),
                   "critic": ("value_batch", "reset")}


def _refuse(obj: Any, member: str, problem: str, fix: str) -> None:
    raise ContractError(f"{type(obj).__name__}.{member} {problem}: {fix}")


def _no_required_arguments(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return True
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def _check_common(obj: Any, role: str) -> None:
    for name in _OPTIONAL_CALLS[role]:
        member = getattr(obj, name, None)
        if member is not None and not callable(member):
            _refuse(obj, name, f"is a {type(member).__name__}", f"make it a method, or remove it ({role} contract: "
                    "capsule_rollout.contracts)")
    reset = getattr(obj, "reset", None)
    if reset is not None and not _no_required_arguments(reset):
        _refuse(obj, "reset", "takes arguments", "reset() is called with none at every episode start (the episode's "
                "seed reaches infer as its noise)")
    keys = getattr(obj, "observation_keys", None)
    if keys is not None and (isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence)
                             or not all(isinstance(k, str) and k for k in keys)):
        _refuse(obj, "observation_keys", f"is {keys!r}", "give a list or tuple of the env's observation keys, "
                "e.g. ['state', 'image_front']")
    key_map = getattr(obj, "key_map", None)
    if key_map is not None and (not isinstance(key_map, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in key_map.items())):
        _refuse(obj, "key_map", f"is {key_map!r}", "give a dict {the name it reads: the env's key or 'prompt'}")


def check_policy(obj: Any) -> None:
    """`obj` against `Policy` (see its docstring): ContractError naming the first member missing or wrong."""
    if not callable(getattr(obj, "infer", None)):
        _refuse(obj, "infer", "is missing" if not hasattr(obj, "infer") else "is not callable",
                "a policy answers infer(obs, *, noise) -> action chunk (T, A) (capsule_rollout.contracts.Policy)")
    _check_common(obj, "policy")
    for name in ("chunk_length", "action_horizon"):
        length = getattr(obj, name, None)
        if length is not None and (isinstance(length, bool) or not isinstance(length, numbers.Integral)
                                   or length < 1):
            _refuse(obj, name, f"is {length!r}", "give the number of actions each infer answers, an int >= 1")
    for name in ("deterministic", "stateless"):
        flag = getattr(obj, name, None)
        if flag is not None and not isinstance(flag, bool):
            _refuse(obj, name, f"is {flag!r}", "give True or False")
    has_get, has_set = callable(getattr(obj, "get_state", None)), callable(getattr(obj, "set_state", None))
    if has_get != has_set:
        missing = "set_state" if has_get else "get_state"
        _refuse(obj, missing, "is missing", "give get_state() and set_state(state) together (what it keeps, as data), "
                "or neither (its object graph is captured)")


def check_critic(obj: Any) -> None:
    """`obj` against `Critic`: ContractError naming the first member missing or wrong."""
    if not callable(getattr(obj, "value", None)):
        _refuse(obj, "value", "is missing" if not hasattr(obj, "value") else "is not callable",
                "a critic answers value(obs) -> float (capsule_rollout.contracts.Critic)")
    _check_common(obj, "critic")
