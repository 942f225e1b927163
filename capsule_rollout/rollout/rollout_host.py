"""`RolloutHost`: the one episode loop (plain Python, no Ray), over the rollout protocols.

Per episode: RESET -> RUNNING -> STOP_INFER -> RECORD -> (next RESET).

The host drives any env, policy and (optional) critic that implement the protocols
of `envs.rollout_env`, `policies.rollout_policy` and `critics.rollout_critic`; the
project's tabletop env, flow policy and value critic are implementations like any
other. Every entry point plays its episodes here: rollouts on Ray, evaluation,
branching from mid-episode capsules, RECAP, the robot. Observers
(`rollout.observer.EpisodeObserver`) attach to its hooks instead of copying it.

- RESET restores the episode's initial capsule: env physics and task, the policy's
  noise generator and language, the critic's, and the host's own state (action
  queue, counters, the hand-off's subtask block). For a (task, seed) seen before
  that is a restore and nothing else; for a new one it is made once by a cold reset
  (`env.reset(seed)`, `policy.reset(noise seed)`, planner, language) and kept in the
  `CapsuleStore`: pinned for the evaluation seeds, LRU otherwise. A robot
  (`env.restorable = False`) is reset physically every time.
- RUNNING is the chunk loop. Every tick the host reads the subtask channel (a new
  version -> new language for policy and critic, and a new chunk at once); when the
  action queue is empty the policy lane and the critic lane run (together on the
  `TwoLaneContext`, or one after the other with `lanes="serial"`) and the first
  `n_exec` actions of the chunk are queued (receding horizon). Each action is
  clipped to the env's action bounds. Stop checks after every step: success,
  operator END, value below a threshold for M consecutive chunks, timeout, safety,
  error.
- STOP_INFER ends inference; RECORD writes the episode (if a recorder is set).

The policy's noise is seeded per episode from (noise_seed, task, seed, attempt,
repeat), so a seed's episode does not depend on which episodes ran before it, on
which host, and is reproducible from its initial capsule alone (see `replay`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence

import numpy as np
import torch

from capsule_rollout.capsules import Arena, Capsule, CapsuleStore, restore, snapshot
from capsule_rollout.critics.rollout_critic import RolloutCritic
from capsule_rollout.envs.rollout_env import RolloutEnv, action_bounds, image_key
from capsule_rollout.models.inputs import provides
from capsule_rollout.policies.execution_context import TwoLaneContext
from capsule_rollout.policies.rollout_policy import RolloutPolicy
from capsule_rollout.robot_side.operator_input import OperatorSource
from capsule_rollout.rollout.chunk_loop import ChunkLoop
from capsule_rollout.rollout.handoff import SubtaskChannel
from capsule_rollout.rollout.host_config import (  # noqa: F401 (capsule_key, episode_noise_seed: re-exported)
    ALLOWED_TRANSITIONS,
    EpisodeResult,
    HostConfig,
    Phase,
    SafetyStop,
    Tick,
    capsule_key,
    episode_noise_seed,
)
from capsule_rollout.rollout.host_config import episode_id as default_episode_id
from capsule_rollout.rollout.host_state import HostState
from capsule_rollout.rollout.observer import EpisodeObserver
from capsule_rollout.rollout.operator_control import OperatorControl
from capsule_rollout.rollout.phase_clock import CAPSULE, COLD_RESET, HOST, RESTORE, PhaseClock
from capsule_rollout.rollout.planner import Planner, ScriptedPlanner
from capsule_rollout.stores.episode import EpisodeBuilder


def _call_optional(component, method: str, *args) -> None:
    fn = getattr(component, method, None)
    if callable(fn):
        fn(*args)


class RolloutHost(ChunkLoop):
    def __init__(
        self,
        *,
        env: RolloutEnv,
        policy: RolloutPolicy,
        critic: RolloutCritic | None = None,
        config: HostConfig = HostConfig(),
        store: CapsuleStore | None = None,
        channel: SubtaskChannel | None = None,
        planner: Planner | None = None,
        recorder=None,
        safety_check: Callable[[dict, np.ndarray], None] | None = None,
        operator: OperatorSource | None = None,
        teleop: Callable[[], np.ndarray] | None = None,
        observers: Sequence[EpisodeObserver] = (),
        capsule_source: Callable[[str, int], Capsule | None] | None = None,
        lanes: TwoLaneContext | None = None,
    ) -> None:
        """`critic`: optional (None: values recorded as NaN, no low-value stop). `operator`: polled
        every control step (END, takeover, coaching, e-stop). `teleop`: the action source while an
        operator has taken over (a leader arm; in sim the scripted expert). `observers`: see
        `rollout.observer`. `capsule_source(key, seed)`: asked for a seed's initial capsule when the store
        does not hold it (e.g. a file another host saved), before resorting to a cold reset. `lanes`: the
        execution context to run policy and critic on (None: one of its own when there is a critic); a slot of
        a `SlotHost` runs none (the slot host runs its rows)."""
        spec = policy.spec
        self.low, self.high = action_bounds(env)
        if self.low.shape != (spec.action_dim,):
            raise ValueError(f"the policy acts with {spec.action_dim} numbers, the env's action space has "
                             f"{self.low.shape[0]}: use a policy trained for this env")
        if config.n_exec > spec.chunk_length:
            raise ValueError(f"n_exec ({config.n_exec}) exceeds the policy's chunk length ({spec.chunk_length})")
        if critic is None and config.value_threshold is not None:
            raise ValueError("value_threshold needs a critic: pass one, or leave value_threshold None")
        available = set(env.observation_spec.arrays)
        for who, part in (("policy", policy), ("critic", critic)):
            missing = [k for k in (part.spec.observation_keys if part is not None else ())
                       if not provides(available, k)]
            if missing:
                raise ValueError(f"the {who} reads observation key(s) {missing}; the env gives {sorted(available)}")
        self.env, self.policy, self.critic, self.config = env, policy, critic, config
        self.store = store if store is not None else CapsuleStore()
        self.shared = contextlib.nullcontext()  # held around the store and the recorder (a SlotHost's lock)
        self.channel = channel if channel is not None else SubtaskChannel()
        self.planner = planner if planner is not None else ScriptedPlanner(self.channel, config.phrasing,
                                                                            getattr(env, "phrase", None))
        self.recorder = recorder
        self.safety_check = safety_check
        self.control = OperatorControl(operator, teleop, self.channel, self.request_end)
        self.observers = list(observers)
        self.capsule_source = capsule_source
        self.state = HostState(spec.chunk_length, spec.action_dim, self._before_snapshot, self._after_restore)
        self.arena = Arena([env, policy, *([critic] if critic is not None else []), self.state]).allocate()
        self._cameras = tuple(env.observation_spec.cameras) if config.record_images else ()
        self._images = tuple((c, image_key(c)) for c in self._cameras)
        self._image_keys = tuple(k for k in env.observation_spec.arrays if k.startswith("image_"))
        self._lazy = False  # images on demand in the current episode (see HostConfig.images_on_demand)
        self._branching = False  # the current episode is a branch (nothing recorded)
        self.lanes = lanes if lanes is not None or critic is None else TwoLaneContext(policy.device)
        self._chunk_out: torch.Tensor | None = None  # what the lanes returned last
        self._value_out: torch.Tensor | None = None
        self.phase = Phase.IDLE
        self.transitions: list[str] = []
        self._seen_version = -1
        self._subtask_index = 0
        self._first_bad = spec.chunk_length  # first non-finite row of the queued chunk
        self.initial_capsule: Capsule | None = None  # the current episode's, restored or made at its reset
        self._end_request: bool | None = None  # operator END: success flag
        self.episode_id = ""  # the episode being played (or played last), for observers
        self._exception: BaseException | None = None  # what ended the current episode with an error
        self._lock = threading.Lock()
        self.clock = PhaseClock(lambda: self.env.steps)  # the phase this host is in, for a watchdog (rollout_actor)

    @property
    def task(self) -> str:
        return self.env.task

    @property
    def value(self) -> float:
        """The critic's value of the current chunk (NaN without a critic or before the first chunk)."""
        return float(self.state.value)

    # the operator's side (see OperatorControl); settable after construction
    @property
    def operator(self) -> OperatorSource | None:
        return self.control.operator

    @operator.setter
    def operator(self, source: OperatorSource | None) -> None:
        self.control.operator = source

    @property
    def teleop(self) -> Callable[[], np.ndarray] | None:
        return self.control.teleop

    @teleop.setter
    def teleop(self, source: Callable[[], np.ndarray] | None) -> None:
        self.control.teleop = source

    @property
    def takeover(self) -> bool:
        return self.control.takeover

    @property
    def events(self) -> list[str]:
        """Operator events of the current episode, as they were applied."""
        return self.control.events

    # -- operator ---------------------------------------------------------------------
    def request_end(self, success: bool) -> None:
        """Operator END (thread-safe): the running episode stops after the current step."""
        with self._lock:
            self._end_request = bool(success)

    # -- state machine ----------------------------------------------------------------
    def _go(self, phase: Phase) -> None:
        if phase not in ALLOWED_TRANSITIONS[self.phase]:
            raise RuntimeError(f"rollout host: transition {self.phase.value} -> {phase.value} is not allowed")
        self.transitions.append(f"{self.phase.value}->{phase.value}")
        self.phase = phase

    def close(self) -> None:
        if self.lanes is not None:
            self.lanes.close()
        self.env.close()

    # -- capsule hooks for the hand-off block and the operator ------------------------
    def _before_snapshot(self) -> None:
        self.state.save_subtask(self.channel, self.planner)
        self.state.save_operator(self.control.operator)

    def _after_restore(self) -> None:
        """Republish the restored subtask and treat it as already seen; the operator's state back."""
        self._seen_version, self._subtask_index = self.state.load_subtask(self.channel, self.planner)
        self._first_bad = self._scan_queue()
        self.state.load_operator(self.control.operator)

    def _scan_queue(self) -> int:
        """Index of the first queued action that is not finite (chunk length when all are)."""
        bad = ~np.isfinite(self.state.queue).all(axis=1)
        return int(bad.argmax()) if bad.any() else len(self.state.queue)

    # -- capsules -----------------------------------------------------------------------
    def snapshot(self, label: str = "", *, step: int | None = None) -> Capsule:
        """A capsule of the whole host (env, policy, critic, queue, hand-off, the operator's state when it
        keeps one: `OperatorSource`) at the current committed boundary: between episodes, or in an observer's
        `chunk_start` (after that step's operator poll: a restore goes on from there without polling again)."""
        return snapshot(self.arena, label=label, step=self.env.steps if step is None else step, force=True)

    # -- RESET --------------------------------------------------------------------------
    def reset(self, seed: int, *, attempt: int = 0, repeat: int = 0) -> tuple[str, float, str, dict | None]:
        """Restore (or make, then keep) the initial capsule of `seed`, seed the policy's noise for
        (attempt, repeat); returns (kind, ms, capsule id, the observation when the reset made one)."""
        self._go(Phase.RESET)
        t0 = time.perf_counter()
        key = capsule_key(self.task, seed)
        obs = None
        if not getattr(self.env, "restorable", True):  # a robot: home it every time; nothing is kept
            self.clock.enter(COLD_RESET)
            capsule, obs = self._cold_reset(seed, key, keep=False)
            kind = "physical"
        else:
            self.clock.enter(RESTORE)
            capsule = self._kept(key, seed)
            if capsule is not None:
                restore(self.arena, capsule)  # the host component's hook republishes the subtask
                kind = "restore"
            else:
                self.clock.switch(COLD_RESET)  # nothing kept: the time so far was the cold reset's
                capsule, obs = self._cold_reset(seed, key)
                kind = "cold"
        self.clock.enter(HOST)
        self.initial_capsule = capsule
        if attempt or repeat:  # another rollout from the same initial state: noise of its own
            self.policy.reset(episode_noise_seed(self.config.noise_seed, self.task, seed, attempt, repeat))
        with self._lock:
            self._end_request = None
        return kind, (time.perf_counter() - t0) * 1e3, capsule.meta.capsule_id, obs

    def _kept(self, key: str, seed: int) -> Capsule | None:
        """The seed's initial capsule from the store, else from `capsule_source`; None: make it."""
        with self.shared:
            return self.store.get(key) if key in self.store else self._fetch(key, seed)

    def _fetch(self, key: str, seed: int) -> Capsule | None:
        """The initial capsule from `capsule_source` (kept in the store, within its budget)."""
        capsule = self.capsule_source(key, seed) if self.capsule_source is not None else None
        if capsule is not None:
            self.store.put(key, capsule, pin=seed in self.config.pin_seeds)
        return capsule

    def _cold_reset(self, seed: int, key: str, keep: bool = True) -> tuple[Capsule, dict]:
        obs, _ = self.env.reset(seed=seed)
        episode_seed = episode_noise_seed(self.config.noise_seed, self.task, seed)
        self.policy.reset(episode_seed)
        if self.critic is not None:
            _call_optional(self.critic, "reset", episode_seed)
        if callable(getattr(self.control.operator, "load_capsule_state", None)):
            _call_optional(self.control.operator, "reset")  # its state is in the capsule: fresh in the initial one
        self.state.clear()
        self.planner.reset(self.env)
        self._seen_version = -1
        self._poll_subtask()
        self._first_bad = len(self.state.queue)
        t0 = time.perf_counter()
        capsule = snapshot(self.arena, label=key, step=0, episode=key, extra={"seed": str(seed), "task": self.task})
        if keep:
            with self.shared:
                self.store.put(key, capsule, pin=seed in self.config.pin_seeds)
        self.clock.add(CAPSULE, time.perf_counter() - t0)
        return capsule, obs

    def _poll_subtask(self) -> bool:
        """Read the channel; on a new version re-encode the language. True when it changed."""
        sub = self.channel.poll(self._seen_version)
        if sub is None:
            return False
        self._seen_version = sub.version
        if not sub.version:  # nothing published yet
            return False
        if sub.index >= 0:
            self._subtask_index = sub.index
        _call_optional(self.policy, "set_language", sub.text)
        if self.critic is not None:
            _call_optional(self.critic, "set_language", sub.text)
        return True

    @property
    def step_limit(self) -> int:
        """The most control steps an episode takes (the config's `max_steps`, capped by the env's limit)."""
        return self._limit()

    def _limit(self, max_steps: int | None = None) -> int:
        env_limit = self.env.max_steps
        return min(max_steps or self.config.max_steps or env_limit, env_limit)

    def run_episode(self, seed: int, *, episode_id: str | None = None, attempt: int = 0,
                    repeat: int = 0) -> EpisodeResult:
        """RESET -> RUNNING -> STOP_INFER -> RECORD for one seed; returns the recorded episode.

        `attempt` / `repeat` > 0: another rollout from the seed's initial capsule (a restore when it
        is kept), with its own policy noise (a retry after a failure / an extra rollout)."""
        return self._drive(self.episode_steps(seed, episode_id=episode_id, attempt=attempt, repeat=repeat))

    def episode_steps(self, seed: int, *, episode_id: str | None = None, attempt: int = 0,
                      repeat: int = 0) -> Generator:
        """`run_episode` as a generator that yields where it needs an inference (see `_drive`)."""
        self.transitions = []
        try:
            try:
                kind, reset_ms, capsule_id, obs = self.reset(seed, attempt=attempt, repeat=repeat)
            except Exception as exc:  # nothing ran: no episode to record
                self.phase = Phase.IDLE
                raise RuntimeError(f"reset of {episode_id or f'seed {seed}'} failed: {type(exc).__name__}: "
                                   f"{exc}") from exc
            episode_id = episode_id or default_episode_id(self.task, seed)  # a robot names its task at reset
            return (yield from self._run(seed, episode_id, kind, reset_ms, capsule_id, obs, None, attempt, repeat))
        finally:
            self.clock.enter(None)  # done: nothing to watch until the next item

    def branch(self, capsule: Capsule, *, seed: int, noise_seed: int | None = None, episode_id: str = "",
               max_steps: int | None = None) -> EpisodeResult:
        """Play on from a capsule taken by `snapshot()` at a chunk boundary of an episode of `seed`:
        restore it, reseed the policy's noise with `noise_seed` (None: the episode's own noise, an
        exact replay), run to the episode's end. The episode holds the steps from the boundary on,
        without images; it is not recorded."""
        return self._drive(self.branch_steps(capsule, seed=seed, noise_seed=noise_seed, episode_id=episode_id,
                                             max_steps=max_steps))

    def branch_steps(self, capsule: Capsule, *, seed: int, noise_seed: int | None = None, episode_id: str = "",
                     max_steps: int | None = None) -> Generator:
        """`branch` as a generator that yields where it needs an inference (see `_drive`)."""
        self.transitions = []
        self._go(Phase.RESET)
        t0 = time.perf_counter()
        self.clock.enter(RESTORE)
        try:
            restore(self.arena, capsule)
            if noise_seed is not None:  # new noise, the state the policy kept left as the capsule has it
                reseed = getattr(self.policy, "reseed", None)
                reseed(noise_seed) if callable(reseed) else self.policy.reset(noise_seed)
        except Exception:
            self.phase = Phase.IDLE
            self.clock.enter(None)
            raise
        self.clock.enter(HOST)
        with self._lock:
            self._end_request = None
        reset_ms = (time.perf_counter() - t0) * 1e3
        recorder, self.recorder = self.recorder, None
        try:
            episode_id = episode_id or f"{default_episode_id(self.task, seed)}-branch"
            return (yield from self._run(seed, episode_id, "branch", reset_ms, capsule.meta.capsule_id, None,
                                         max_steps, 0, 0))
        finally:
            self.recorder = recorder
            self.clock.enter(None)

    def _run(self, seed: int, episode_id: str, kind: str, reset_ms: float, capsule_id: str, obs: dict | None,
             max_steps: int | None, attempt: int, repeat: int) -> Generator:
        self._go(Phase.RUNNING)
        env, self.episode_id, self._exception = self.env, episode_id, None
        if obs is None:  # restored: the observation of the committed state
            obs = env.observe()
        builder = EpisodeBuilder()
        self._branching = kind == "branch"
        self._lazy = (self.config.images_on_demand and hasattr(env, "images_wanted")
                      and (self._branching or not self._images)
                      and not any(getattr(o, "needs_images", False) for o in self.observers))
        self.control.start_episode()
        for observer in self.observers:
            observer.episode_start(self, seed)
        t0 = time.perf_counter()
        reason, success, error = yield from self._loop(obs, builder, self._limit(max_steps))
        self._lazy = self._branching = False  # a tick called on its own (outside an episode) draws every image
        run_s = time.perf_counter() - t0
        self._go(Phase.STOP_INFER)
        self._go(Phase.RECORD)
        n = len(builder)
        if n == 0:  # failed before the first step: there is nothing to record
            self._go(Phase.IDLE)
            return EpisodeResult(episode=None, reset_kind=kind, reset_ms=reset_ms, run_s=run_s, steps_per_s=0.0,
                                 error=error or reason.value, transitions=list(self.transitions),
                                 exception=self._exception, initial_capsule=self.initial_capsule)
        episode = builder.finish(
            episode_id=episode_id, seed=seed, task=self.task, instruction=env.instruction, success=success,
            stop_reason=reason.value, initial_capsule_id=capsule_id, subtasks=list(env.subtask_texts),
            operator_events=self.events, attempt=attempt, repeat=repeat,
        )
        result = EpisodeResult(episode=episode, reset_kind=kind, reset_ms=reset_ms, run_s=run_s,
                               steps_per_s=n / run_s if run_s > 0 else 0.0, error=error,
                               transitions=list(self.transitions), exception=self._exception,
                               initial_capsule=self.initial_capsule)
        for observer in self.observers:
            observer.episode_end(self, result)
        if self.recorder is not None:
            with self.shared:
                self.recorder.write(episode)
        return result

    def run(self, seeds: Iterable[int]) -> list[EpisodeResult]:
        return [self.run_episode(seed) for seed in seeds]
