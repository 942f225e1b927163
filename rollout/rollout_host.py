"""`RolloutHost`: one rollout host's episode state machine (plain Python, no Ray).

Per episode: RESET -> RUNNING -> STOP_INFER -> RECORD -> (next RESET).

- RESET restores the episode's initial capsule: env physics and task, the policy's
  noise generator and subtask embedding, the critic's subtask embedding, and the
  host's own state (action queue, counters, the hand-off's subtask block). For a
  (family, seed) seen before that is a restore and nothing else; for a new one it
  is made once by a cold reset (`env.reset(seed)`, planner, language encodings) and
  kept in the `CapsuleStore`: pinned for the evaluation seeds, LRU otherwise.
- RUNNING is the chunk loop. Every tick the host reads the subtask channel (a new
  version -> new language for policy and critic, and a new chunk at once); when the
  action queue is empty the policy lane and the critic lane run together on the
  `TwoLaneContext` and the first `n_exec` actions of the chunk are queued
  (receding horizon). Stop checks after every step: success, operator END, value
  below a threshold for M consecutive chunks, timeout, safety, error.
- STOP_INFER ends inference; RECORD writes the episode (if a recorder is set).

The noise of each episode's policy is seeded from (noise_seed, family, seed), so a
seed's episode is reproducible from its initial capsule alone (see `replay`).
"""

from __future__ import annotations

import enum
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from capsules import Arena, BufferComponent, BufferSpec, CapsuleStore, restore, snapshot
from critics.critic_runtime import CriticRuntime
from envs.operator_input import OperatorSource
from envs.tabletop_env import ACTION_DIM, TabletopEnv, image_key
from policies.execution_context import TwoLaneContext
from policies.policy_runtime import PolicyRuntime
from rollout import episode_schema as S
from rollout.episode import Episode, EpisodeBuilder
from rollout.handoff import NBYTES, SubtaskChannel
from rollout.planner import Planner, ScriptedPlanner


class Phase(str, enum.Enum):
    IDLE = "idle"
    RESET = "reset"
    RUNNING = "running"
    STOP_INFER = "stop_infer"
    RECORD = "record"


SUCCESS, OPERATOR_END, LOW_VALUE, TIMEOUT, SAFETY, ERROR, ABORTED = S.STOP_REASONS
_ALLOWED = {
    Phase.IDLE: {Phase.RESET},
    Phase.RESET: {Phase.RUNNING, Phase.STOP_INFER},  # a reset can fail: error, recorded if there were steps
    Phase.RUNNING: {Phase.STOP_INFER},
    Phase.STOP_INFER: {Phase.RECORD},
    Phase.RECORD: {Phase.RESET, Phase.IDLE},
}


class SafetyStop(Exception):
    """Raised by a safety check: the episode stops with stop reason `safety`."""


@dataclass(frozen=True)
class HostConfig:
    n_exec: int = 8
    """Actions of each chunk executed before the next inference (receding horizon)."""
    value_threshold: float | None = None
    """Stop when the critic's value is below this for `value_patience` consecutive chunks (None: never)."""
    value_patience: int = 3
    """M: consecutive low-value chunks before stopping."""
    max_steps: int | None = None
    """Timeout in control steps (None: the env's limit)."""
    planner_every: int = 1
    """Control steps between planner updates (the planner's rate)."""
    noise_seed: int = 0
    """Base seed of the policy's per-episode noise."""
    pin_seeds: tuple[int, ...] = ()
    """Seeds whose initial capsules stay pinned in the store (a fixed evaluation set)."""
    record_images: bool = True
    """Record the cameras' images in each episode."""

    def __post_init__(self) -> None:
        if self.n_exec < 1 or self.value_patience < 1 or self.planner_every < 1:
            raise ValueError("n_exec, value_patience and planner_every must be >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")


@dataclass
class Tick:
    """What one control step did (see `RolloutHost.tick`)."""

    new_chunk: bool
    value: float
    low_value: bool = False
    proposed: np.ndarray | None = None
    action: np.ndarray | None = None
    subtask_id: int = 0
    obs: dict | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)
    intervention: bool = False


@dataclass
class EpisodeResult:
    episode: Episode | None  # None only when the episode failed before its first step
    reset_kind: str  # "restore" or "cold"
    reset_ms: float
    run_s: float
    steps_per_s: float
    error: str = ""
    transitions: list[str] = field(default_factory=list)

    @property
    def meta(self):
        return self.episode.meta


class _HostState(BufferComponent):
    """The host's own committed state: action queue, counters, the subtask block."""

    def __init__(self, horizon: int, before_snapshot: Callable[[], None], after_restore: Callable[[], None]) -> None:
        super().__init__()
        self.name = "host"
        self.horizon = horizon
        self._before, self._after = before_snapshot, after_restore

    def before_snapshot(self) -> None:
        self._before()

    def after_restore(self) -> None:
        self._after()

    def buffer_specs(self) -> list[BufferSpec]:
        return [
            BufferSpec("queue", (self.horizon, ACTION_DIM), torch.float32, doc="actions left of the current chunk"),
            BufferSpec("counters", (5,), torch.int64,
                       doc="queue position, queue length, low-value chunks, chunks, planner's last subtask"),
            BufferSpec("value", (), torch.float32, doc="critic value of the current chunk"),
            BufferSpec("subtask", (NBYTES,), torch.uint8, doc="the hand-off channel's block at the boundary"),
        ]

    def fingerprint(self) -> Mapping[str, str]:
        return {"kind": "rollout_host", "horizon": str(self.horizon), "subtask_bytes": str(NBYTES)}


def episode_noise_seed(noise_seed: int, family: str, seed: int) -> int:
    """The policy's noise seed for one episode (stable across processes and runs)."""
    return (noise_seed * 1_000_003 + zlib.crc32(family.encode()) * 7919 + seed) % (2**62)


def capsule_key(family: str, seed: int) -> str:
    return f"{family}/s{seed:07d}"


class RolloutHost:
    def __init__(
        self,
        *,
        env: TabletopEnv,
        policy: PolicyRuntime,
        critic: CriticRuntime,
        config: HostConfig = HostConfig(),
        store: CapsuleStore | None = None,
        channel: SubtaskChannel | None = None,
        planner: Planner | None = None,
        recorder=None,
        safety_check: Callable[[dict, np.ndarray], None] | None = None,
        operator: OperatorSource | None = None,
        teleop: Callable[[], np.ndarray] | None = None,
    ) -> None:
        """`operator`: polled every control step (END, takeover, coaching, e-stop). `teleop`: the action
        source while an operator has taken over (a leader arm; in sim the scripted expert)."""
        if config.n_exec > policy.config.horizon:
            raise ValueError(f"n_exec ({config.n_exec}) exceeds the policy's chunk length ({policy.config.horizon})")
        missing = [c for c in (*policy.config.cameras, *critic.config.cameras) if c not in env.cameras]
        if missing:
            raise ValueError(f"policy/critic need camera(s) {missing}; the env renders {list(env.cameras)}")
        self.env, self.policy, self.critic, self.config = env, policy, critic, config
        self.store = store if store is not None else CapsuleStore()
        self.channel = channel if channel is not None else SubtaskChannel()
        self.planner = planner if planner is not None else ScriptedPlanner(self.channel)
        self.recorder = recorder
        self.safety_check = safety_check
        self.operator, self.teleop = operator, teleop
        self.takeover = False
        self.events: list[str] = []  # operator events of the current episode, as they were applied
        self.state = _HostState(policy.config.horizon, self._save_subtask, self._load_subtask)
        self.arena = Arena([env, policy, critic, self.state]).allocate()
        self.lanes = TwoLaneContext(policy.device)
        self.phase = Phase.IDLE
        self.transitions: list[str] = []
        self._seen_version = -1
        self._subtask_index = 0
        self._end_request: bool | None = None  # operator END: success flag
        self._lock = threading.Lock()

    @property
    def family(self) -> str:
        return self.env.family.name

    # -- operator ---------------------------------------------------------------------
    def request_end(self, success: bool) -> None:
        """Operator END (thread-safe): the running episode stops after the current step."""
        with self._lock:
            self._end_request = bool(success)

    # -- state machine ----------------------------------------------------------------
    def _go(self, phase: Phase) -> None:
        if phase not in _ALLOWED[self.phase]:
            raise RuntimeError(f"rollout host: transition {self.phase.value} -> {phase.value} is not allowed")
        self.transitions.append(f"{self.phase.value}->{phase.value}")
        self.phase = phase

    def close(self) -> None:
        self.lanes.close()
        self.env.close()

    # -- capsule hooks for the hand-off block ------------------------------------------
    def _save_subtask(self) -> None:
        block = self.state.buffers["subtask"]
        block.copy_(self.channel.tensor)
        # the version counter is this process's publish count, not state: keep "published or not"
        seq = block[:8].view(torch.int64)
        seq.fill_(2 if int(seq) > 0 else 0)
        published = getattr(self.planner, "published", None)
        self.state.buffers["counters"][4] = -1 if published is None else published

    def _load_subtask(self) -> None:
        """After a restore: republish the restored subtask, and treat it as already seen."""
        block = SubtaskChannel()
        block.tensor.copy_(self.state.buffers["subtask"])
        sub = block.read()
        if sub.version:
            self.channel.publish(sub.text, sub.index, source=2 if sub.source == "coach" else 1)
        self._seen_version = self.channel.version()
        self._subtask_index = max(sub.index, 0) if sub.version else 0
        if hasattr(self.planner, "published"):  # what the planner last published, as at the boundary
            published = int(self.state.buffers["counters"][4])
            self.planner.published = None if published < 0 else published

    # -- RESET --------------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[str, float, str]:
        """Restore (or make, then keep) the initial capsule of `seed`; returns (kind, ms, capsule id)."""
        self._go(Phase.RESET)
        t0 = time.perf_counter()
        key = capsule_key(self.family, seed)
        if not getattr(self.env, "restorable", True):  # a robot: home it every time; nothing is kept
            capsule = self._cold_reset(seed, key, keep=False)
            kind = "physical"
        elif key in self.store:
            capsule = self.store.get(key)
            restore(self.arena, capsule)  # the host component's hook republishes the subtask
            kind = "restore"
        else:
            capsule = self._cold_reset(seed, key)
            kind = "cold"
        with self._lock:
            self._end_request = None
        return kind, (time.perf_counter() - t0) * 1e3, capsule.meta.capsule_id

    def _cold_reset(self, seed: int, key: str, keep: bool = True):
        self.env.reset(seed=seed)
        self.planner.reset(self.env)
        self._seen_version = -1
        self._poll_subtask()
        self.policy.buffers["rng"].copy_(torch.tensor([episode_noise_seed(self.config.noise_seed, self.family, seed), 0]))
        b = self.state.buffers
        b["queue"].zero_()
        b["counters"].zero_()
        b["value"].fill_(float("nan"))
        capsule = snapshot(self.arena, label=key, step=0, episode=key, extra={"seed": str(seed), "family": self.family})
        if keep:
            self.store.put(key, capsule, pin=seed in self.config.pin_seeds)
        return capsule

    def _poll_subtask(self) -> bool:
        """Read the channel; on a new version re-encode the language. True when it changed."""
        sub = self.channel.poll(self._seen_version)
        if sub is None:
            return False
        self._seen_version = sub.version
        if sub.index >= 0:
            self._subtask_index = sub.index
        self.policy.set_subtask(sub.text)
        self.critic.set_subtask(sub.text)
        return True

    # -- RUNNING ----------------------------------------------------------------------
    def _infer(self, obs: dict) -> None:
        images = {c: obs[image_key(c)] for c in self.policy.config.cameras}
        self.policy.load_observation(images, obs["state"])
        self.critic.load_observation({c: obs[image_key(c)] for c in self.critic.config.cameras}, obs["state"],
                                     step=self.env.steps)
        self.lanes.run(self.policy.runner, self.critic.runner)
        b = self.state.buffers
        b["queue"].copy_(self.policy.buffers["chunk"][0])
        value = self.critic.buffers["value"][0]
        b["value"].copy_(value)
        c = b["counters"]
        c[0], c[1] = 0, self.config.n_exec
        threshold = self.config.value_threshold
        c[2] = c[2] + 1 if threshold is not None and float(value) < threshold else 0
        c[3] += 1

    def _operator_events(self, step: int) -> str | None:
        """Apply what the operator did since the last step; returns "estop" when the robot must stop."""
        if self.operator is None:
            return None
        for event in self.operator.poll(step):
            kind = event.kind.value
            self.events.append(f"{step}:{kind}:{event.text}" if event.text else f"{step}:{kind}")
            if kind in ("end_success", "end_failure"):
                self.request_end(kind == "end_success")
            elif kind == "coach":
                self.channel.coach(event.text)
            elif kind in ("takeover_on", "takeover_off"):
                if self.teleop is None:
                    self.events.append(f"{step}:takeover ignored (no teleop source)")
                else:
                    self.takeover = kind == "takeover_on"
            elif kind == "estop":
                estop = getattr(self.env, "estop", None)
                if callable(estop):
                    estop()
                return "estop"
        return None

    def _teleop_tick(self) -> Tick:
        """One step driven by the operator: recorded as an intervention; the policy's chunk is dropped."""
        b = self.state.buffers
        self._poll_subtask()
        b["counters"][1] = 0  # after a human moved the robot, the policy plans afresh
        action = np.clip(np.asarray(self.teleop(), np.float32).reshape(-1), -1.0, 1.0)
        if not np.all(np.isfinite(action)):
            raise SafetyStop(f"teleoperation sent a non-finite action {action.tolist()}")
        tick = Tick(new_chunk=False, value=float("nan"), action=action, subtask_id=self._subtask_index,
                    intervention=True)
        tick.obs, tick.reward, tick.terminated, tick.truncated, tick.info = self.env.step(action)
        if self.env.steps % self.config.planner_every == 0:
            self.planner.update(self.env)
        return tick

    def tick(self, obs: dict) -> Tick:
        """One control step of the chunk loop from observation `obs` (the env's current one).

        Reads the hand-off (a new subtask -> new language, new chunk), runs both lanes
        when the queue is empty, and executes the next queued action. A low-value
        stop, when due, is reported before acting (`tick.low_value`, nothing executed).
        """
        b, cfg = self.state.buffers, self.config
        if self._poll_subtask():
            b["counters"][1] = 0  # new language: new chunk now
        c = b["counters"]
        new_chunk = int(c[0]) >= int(c[1])
        if new_chunk:
            self._infer(obs)
            if cfg.value_threshold is not None and int(c[2]) >= cfg.value_patience:
                return Tick(new_chunk=True, value=float(b["value"]), low_value=True)
        proposed = b["queue"][int(c[0])].numpy().copy()
        c[0] += 1
        tick = Tick(new_chunk=new_chunk, value=float(b["value"]), proposed=proposed, subtask_id=self._subtask_index)
        if not np.all(np.isfinite(proposed)):
            raise SafetyStop(f"policy proposed a non-finite action {proposed.tolist()}")
        tick.action = np.clip(proposed, -1.0, 1.0)
        if self.safety_check is not None:
            self.safety_check(obs, tick.action)
        tick.obs, tick.reward, tick.terminated, tick.truncated, tick.info = self.env.step(tick.action)
        if self.env.steps % cfg.planner_every == 0:
            self.planner.update(self.env)
        return tick

    def run_episode(self, seed: int, *, episode_id: str | None = None) -> EpisodeResult:
        """RESET -> RUNNING -> STOP_INFER -> RECORD for one seed; returns the recorded episode."""
        self.transitions = []
        episode_id = episode_id or f"{self.family}-s{seed:07d}"
        builder = EpisodeBuilder()
        error, reason, success = "", TIMEOUT, False
        try:
            kind, reset_ms, capsule_id = self.reset(seed)
        except Exception as exc:  # nothing ran: no episode to record
            self.phase = Phase.IDLE
            raise RuntimeError(f"reset of {episode_id} failed: {type(exc).__name__}: {exc}") from exc
        self._go(Phase.RUNNING)
        env, cfg = self.env, self.config
        limit = min(cfg.max_steps or env.max_steps, env.max_steps)
        obs = env.observe()
        t0 = time.perf_counter()
        self.takeover, self.events = False, []
        try:
            while True:
                if self._operator_events(env.steps) == "estop":
                    reason, error = SAFETY, "operator e-stop"
                    break
                tick = self._teleop_tick() if self.takeover else self.tick(obs)
                # an episode executes at least one step, so every stop is recorded
                if tick.low_value and len(builder):
                    reason = LOW_VALUE
                    break
                if tick.low_value:  # stop due before the first step: run the chunk anyway
                    self.state.buffers["counters"][2] = 0
                    continue
                images = {c_: obs[image_key(c_)] for c_ in env.cameras} if cfg.record_images else {}
                builder.add(images=images, state=obs["state"], action=tick.action, reward=tick.reward,
                            policy_action=tick.proposed, value=tick.value if tick.new_chunk else float("nan"),
                            subtask_id=tick.subtask_id, intervention=tick.intervention)
                obs = tick.obs
                with self._lock:
                    end = self._end_request
                if tick.info["success"]:
                    reason, success = SUCCESS, True
                    break
                if end is not None:
                    reason, success = OPERATOR_END, end
                    break
                if tick.truncated or env.steps >= limit:
                    reason = TIMEOUT
                    break
        except SafetyStop as exc:
            reason, error = SAFETY, str(exc) or "safety check stopped the episode"
        except Exception as exc:  # recorded (as an error, or the reason it names); the host stays usable
            named = getattr(exc, "stop_reason", None)
            reason = named if named in S.STOP_REASONS else ERROR
            error = f"{type(exc).__name__}: {exc}"
        run_s = time.perf_counter() - t0
        self._go(Phase.STOP_INFER)
        self._go(Phase.RECORD)
        n = len(builder)
        if n == 0:  # failed before the first step: there is nothing to record
            self._go(Phase.IDLE)
            return EpisodeResult(episode=None, reset_kind=kind, reset_ms=reset_ms, run_s=run_s, steps_per_s=0.0,
                                 error=error or reason, transitions=list(self.transitions))
        episode = builder.finish(
            episode_id=episode_id, seed=seed, task=self.family, instruction=env.instruction, success=success,
            stop_reason=reason, initial_capsule_id=capsule_id, subtasks=[s.text for s in env.subtasks],
            operator_events=self.events,
        )
        if self.recorder is not None:
            self.recorder.write(episode)
        return EpisodeResult(episode=episode, reset_kind=kind, reset_ms=reset_ms, run_s=run_s,
                             steps_per_s=n / run_s if run_s > 0 and n else 0.0, error=error,
                             transitions=list(self.transitions))

    def run(self, seeds: Iterable[int]) -> list[EpisodeResult]:
        return [self.run_episode(seed) for seed in seeds]
