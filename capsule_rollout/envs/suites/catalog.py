"""The registry of suites: env id -> a rollout-protocol env (a `MujocoCapsuleEnv` built from the suite's
declarations, or the suite's own `RolloutEnv`). Suites are built in (gymnasium, metaworld, robotics) or
registered by an installed package under the entry-point group `capsule_rollout.suites` (`name =
"package.module"`), as the tabletop example registers `tabletop`."""

from __future__ import annotations

import dataclasses
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
from capsule_rollout.extras import install_command
from capsule_rollout.import_path import OBJECTS, resolve, split_kwargs
from capsule_rollout.user_code import UserCodeError, one_line, user_frames


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
    Suite("metaworld", "capsule_rollout.envs.suites.metaworld_v3", install_command("metaworld") + " (brings mujoco 3.3.0)",
          "Meta-World v3 manipulation tasks with their scripted policies"),
    Suite("robotics", "capsule_rollout.envs.suites.robotics", install_command("robotics") + " (brings mujoco 3.3.0)",
          "gymnasium-robotics Fetch and Franka Kitchen"),
    Suite("robosuite", "capsule_rollout.envs.suites.robosuite_v15",
          install_command("robosuite") + " && pip install --no-deps robosuite==1.5.2 (mujoco 3.3.0)",
          "robosuite 1.5 single-arm manipulation (Lift, Stack, Door, ...), Panda, default controller"),
    Suite("aloha", "capsule_rollout.envs.suites.aloha", install_command("aloha") + " (brings mujoco 3.3.0)",
          "gym-aloha's bimanual ALOHA tasks (Insertion, TransferCube) on dm_control"),
    Suite("so101", "capsule_rollout.envs.suites.so101", install_command("so101") + " (mujoco < 4)",
          "the SO-101 arm's pick-cube env (lerobot-env-so101)"),
    *_registered(),
)}


def parse_env_id(env_id: str) -> tuple[Suite | None, str]:
    """(suite, task) for `suite:task`; (None, env_id) for an import path `package.module:factory`."""
    prefix, sep, rest = env_id.partition(":")
    if prefix == OBJECTS and rest:  # a factory handed over in Python (`import_path.object_source`)
        return None, env_id
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
    if task not in known and not getattr(module, "accepts", lambda _: False)(task):
        close = difflib.get_close_matches(task, known, n=3)
        raise ValueError(f"{suite.name} has no task {task!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                                 f"; it has {len(known)}, e.g. {known[:4]}"))
    if hasattr(module, "make_rollout_env"):  # the suite's own rollout-protocol env
        return module.make_rollout_env(task, cameras=cameras, image_size=image_size, max_steps=max_steps)
    env, capture = module.make(task)
    if capture.cameras is not None:  # the model's own cameras by name, beside those the suite declares
        extra = {k: v for k, v in model_cameras(find_physics(env)[0]).items() if k not in capture.cameras}
        if extra and cameras is not None and any(c in extra for c in cameras):
            capture = dataclasses.replace(capture, cameras={**capture.cameras, **extra})
    chosen = tuple(capture.cameras)[:1] if cameras is None else tuple(cameras)
    return MujocoCapsuleEnv(env, capture, cameras=chosen, image_size=image_size, max_steps=max_steps)


def _from_import_path(path: str, cameras, image_size: int, max_steps: int | None) -> RolloutEnv:
    """A factory's env (`package.module:factory`, or `package.module:factory={JSON kwargs}`: called with them)."""
    factory_path, kwargs = split_kwargs(path, "env")
    factory = resolve(factory_path, "env")
    load_triton_first()  # before the user's code can make a GL context (Mesa's LLVM, then Triton's: a crash)
    try:
        made = factory(**kwargs)
    except Exception as exc:  # the user's code: one line naming the factory, and the user's own frames
        raise UserCodeError(f"env factory {path!r} raised {one_line(exc)}", user_frames(exc)) from exc
    if isinstance(made, RolloutEnv) and not isinstance(made, gym.Env):
        return made
    if not isinstance(made, gym.Env):
        raise ValueError(f"{path} returned {type(made).__name__}; it must return a RolloutEnv or a gymnasium env")
    # nothing declared: the adapter captures the env's whole object graph (CaptureSpec.graph)
    return _undeclared(made, path, cameras, image_size, max_steps)


def _undeclared(made: gym.Env, task: str, cameras, image_size: int, max_steps: int | None) -> MujocoCapsuleEnv:
    """A gymnasium MuJoCo env nobody declared anything for: its whole object graph captured, success its step
    info's, the cameras its model defines by their names and a free camera `free` (the default)."""
    model = find_physics(made)[0]
    capture = CaptureSpec(task=task, cameras={"free": default_camera(model), **model_cameras(model)},
                          max_steps=_step_limit(made) or 1000, success=info_success)
    chosen = ("free",) if cameras is None else tuple(cameras)
    return MujocoCapsuleEnv(made, capture, cameras=chosen, image_size=image_size, max_steps=max_steps)


def model_cameras(model) -> dict[str, Camera]:
    """Every named camera of a MuJoCo model, as a camera of the framework's renderer under the model's name."""
    names = [model.camera(i).name for i in range(model.ncam)]
    return {name: Camera(name, model_camera=name) for name in names if name}


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
