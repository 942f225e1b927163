"""The registry of suites: env id -> a rollout-protocol env (a `MujocoCapsuleEnv` built from the suite's
declarations, or the suite's own `RolloutEnv`). Suites are built in (gymnasium, metaworld, robotics) or
registered by an installed package under the entry-point group `capsule_rollout.suites` (`name =
"package.module"`), as the tabletop example registers `tabletop`."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import gymnasium as gym
import numpy as np

from capsule_rollout.envs.gl_backend import load_triton_first
from capsule_rollout.envs.mujoco_capsule import Camera, CaptureSpec, MujocoCapsuleEnv, find_physics
from capsule_rollout.envs.rollout_env import RolloutEnv
from capsule_rollout.import_path import resolve


class SuiteUnavailableError(ValueError):
    """A suite's package is missing or cannot run on this MuJoCo; the message says what to install."""


@dataclass(frozen=True)
class Suite:
    """One registered suite: its declarations module and how users install it."""

    name: str
    module: str
    """Module with `check()`, `tasks()`, `make(task) -> (gym.Env, CaptureSpec)` (or `make_rollout_env(task,
    cameras=, image_size=, max_steps=) -> RolloutEnv`), and optionally `expert(env)`."""
    install: str
    summary: str

    def load(self):
        mod = importlib.import_module(self.module)
        mod.check()
        return mod


SUITES_GROUP = "capsule_rollout.suites"


def _registered() -> list[Suite]:
    """Suites installed packages register (their modules are imported only when used)."""
    return [Suite(e.name, e.value, f"installed with {e.dist.name if e.dist else 'its package'}",
                  f"registered by {e.dist.name if e.dist else e.value}") for e in entry_points(group=SUITES_GROUP)]


SUITES: dict[str, Suite] = {s.name: s for s in (
    Suite("gymnasium", "capsule_rollout.envs.suites.gymnasium_v5", "installed with the project",
          "gymnasium's MuJoCo v5 envs (Ant, HalfCheetah, Hopper, Humanoid, Pusher, Reacher, ...)"),
    Suite("metaworld", "capsule_rollout.envs.suites.metaworld_v3", 'pip install -e ".[metaworld]" (brings mujoco 3.3.0)',
          "Meta-World v3 manipulation tasks with their scripted policies"),
    Suite("robotics", "capsule_rollout.envs.suites.robotics", 'pip install -e ".[robotics]" (brings mujoco 3.3.0)',
          "gymnasium-robotics Fetch and Franka Kitchen"),
    Suite("robosuite", "capsule_rollout.envs.suites.robosuite_v15",
          'pip install -e ".[robosuite]" && pip install --no-deps robosuite==1.5.2 (mujoco 3.3.0)',
          "robosuite 1.5 single-arm manipulation (Lift, Stack, Door, ...), Panda, default controller"),
    Suite("aloha", "capsule_rollout.envs.suites.aloha", 'pip install -e ".[aloha]" (brings mujoco 3.3.0)',
          "gym-aloha's bimanual ALOHA tasks (Insertion, TransferCube) on dm_control"),
    Suite("so101", "capsule_rollout.envs.suites.so101", 'pip install -e ".[so101]" (mujoco < 4)',
          "the SO-101 arm's pick-cube env (lerobot-env-so101)"),
    *_registered(),
)}


def parse_env_id(env_id: str) -> tuple[Suite | None, str]:
    """(suite, task) for `suite:task`; (None, env_id) for an import path `package.module:factory`."""
    prefix, sep, rest = env_id.partition(":")
    if not sep or not rest:
        raise ValueError(f"env id {env_id!r}: write `suite:task` (suites: {', '.join(SUITES)}) or an import "
                         "path `package.module:factory`")
    if prefix in SUITES:
        return SUITES[prefix], rest
    if "." not in prefix and importlib.util.find_spec(prefix) is None:  # neither a suite nor a module
        close = difflib.get_close_matches(prefix, list(SUITES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"env id {env_id!r}: no suite {prefix!r}{hint}; suites: {', '.join(SUITES)}, or give "
                         "an import path `package.module:factory`")
    return None, env_id


def suite_tasks(name: str) -> list[str]:
    return list(SUITES[name].load().tasks())


def make_env(env_id: str, *, cameras: Sequence[str] | None = None, image_size: int = 64,
             max_steps: int | None = None) -> RolloutEnv:
    """The env `env_id` names, as a rollout-protocol env. `cameras`: None for the suite's default camera,
    () for state only."""
    suite, task = parse_env_id(env_id)
    if suite is None:
        return _from_import_path(env_id, cameras, image_size, max_steps)
    load_triton_first()  # before the suite can make a GL context
    module = suite.load()
    known = list(module.tasks())
    if task not in known:
        close = difflib.get_close_matches(task, known, n=3)
        raise ValueError(f"{suite.name} has no task {task!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                                 f"; it has {len(known)}, e.g. {known[:4]}"))
    if hasattr(module, "make_rollout_env"):  # the suite's own rollout-protocol env
        return module.make_rollout_env(task, cameras=cameras, image_size=image_size, max_steps=max_steps)
    env, capture = module.make(task)
    chosen = tuple(capture.cameras)[:1] if cameras is None else tuple(cameras)
    return MujocoCapsuleEnv(env, capture, cameras=chosen, image_size=image_size, max_steps=max_steps)


def _from_import_path(path: str, cameras, image_size: int, max_steps: int | None) -> RolloutEnv:
    factory = resolve(path, "env")
    load_triton_first()  # before the user's code can make a GL context (Mesa's LLVM, then Triton's: a crash)
    made = factory()
    if isinstance(made, RolloutEnv) and not isinstance(made, gym.Env):
        return made
    if not isinstance(made, gym.Env):
        raise ValueError(f"{path} returned {type(made).__name__}; it must return a RolloutEnv or a gymnasium env")
    # nothing declared: the adapter captures the env's whole object graph (CaptureSpec.graph)
    capture = CaptureSpec(task=path, cameras={"free": default_camera(find_physics(made)[0])},
                          max_steps=_step_limit(made) or 1000, success=info_success)
    chosen = ("free",) if cameras is None else tuple(cameras)
    return MujocoCapsuleEnv(made, capture, cameras=chosen, image_size=image_size, max_steps=max_steps)


def info_success(info: Mapping[str, Any]) -> bool:
    """A user's env says success in its step info, as `success` or `is_success` (gymnasium-robotics' name)."""
    return bool(info.get("success", info.get("is_success", False)))


def _step_limit(env: gym.Env) -> int | None:
    """The episode step limit: the env's spec, else a `TimeLimit` among its wrappers."""
    if env.spec is not None and env.spec.max_episode_steps:
        return int(env.spec.max_episode_steps)
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return None


def default_camera(model, name: str = "free", elevation: float = -25.0) -> Camera:
    """A fixed free camera on the model's centre (from the compiled model, not the live geometry)."""
    return Camera(name, lookat=tuple(float(x) for x in model.stat.center), distance=float(1.6 * model.stat.extent),
                  azimuth=90.0, elevation=elevation)


def expert_for(env: RolloutEnv) -> Callable[[], np.ndarray] | None:
    """The env's own scripted policy (`env.expert()`), or its suite's (acting on its boundary observation), or
    None."""
    own = getattr(env, "expert", None)
    if callable(own):
        return own()
    if not isinstance(env, MujocoCapsuleEnv):
        return None
    suite, _ = parse_env_id(env.task)
    if suite is None:
        return None
    fn = getattr(suite.load(), "expert", None)
    return fn(env) if fn is not None else None
