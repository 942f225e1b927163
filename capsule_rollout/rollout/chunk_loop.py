"""The chunk loop of `RolloutHost` (a mixin: the host's own state is `self`'s): per control step, read the
hand-off, run the policy and critic when the queue is empty, execute the next queued action; the stop checks.

The loop is written as generators that yield where a chunk is needed: `RolloutHost._drive` runs one alone (the
lanes at each yield), `SlotHost` runs many and serves their requests with one batched call per round.
"""

from __future__ import annotations

from collections.abc import Generator
from time import perf_counter

import numpy as np

from capsule_rollout.envs.rollout_env import STATE_KEY
from capsule_rollout.rollout.host_config import SafetyStop, Tick, two_lanes
from capsule_rollout.rollout.phase_clock import CHUNK, HOST, RECORD_STEP, STEP
from capsule_rollout.stores.episode import EpisodeBuilder
from capsule_rollout.stores.episode_schema import PRIVILEGED, STOP_REASONS, StopReason
from capsule_rollout.user_code import describe


class ChunkLoop:
    # -- RUNNING ----------------------------------------------------------------------
    def _policy_lane(self) -> None:
        self._chunk_out = self.policy.act()

    def _critic_lane(self) -> None:
        self._value_out = self.critic.evaluate()

    def _run_lanes(self) -> None:
        """The policy (and critic) on the loaded observation: the chunk and value of the request."""
        if self.critic is None:
            self._policy_lane()
        elif two_lanes(self.config, self.policy.device):
            self.lanes.run(self._policy_lane, self._critic_lane)
        else:
            self.lanes.serial(self._policy_lane, self._critic_lane)

    def _drive(self, steps: Generator):
        """Run one of the loop's generators alone: each inference it asks for runs here, on this host's lanes
        (a `SlotHost` drives its slots' generators instead, with one batched call per round)."""
        clock = self.clock
        try:
            next(steps)
            while True:
                clock.enter(CHUNK)
                try:
                    self._run_lanes()
                except Exception as exc:  # raised where the loop asked for it (recorded like an env error)
                    clock.enter(None)
                    steps.throw(exc)
                else:
                    clock.enter(None)
                    steps.send(None)
        except StopIteration as done:
            return done.value

    def _infer(self, obs: dict) -> None:
        self._drive(self._infer_steps(obs))

    def _infer_steps(self, obs: dict) -> Generator:
        """The chunk start: observers, observation loaded; then (yield) the inference runs; the chunk queued."""
        if self._lazy and any(key not in obs for key in self._image_keys):  # a chunk forced between chunk starts
            obs = self.env.observe()
        for observer in self.observers:
            observer.chunk_start(self, obs)
        self.policy.load_observation(obs)
        critic, st = self.critic, self.state
        if critic is not None:
            critic.load_observation(obs, self.env.steps)
        self.clock.enter(None)  # waiting for the chunk: the call is watched where it runs
        try:
            yield  # the policy's (and critic's) call: this host's lanes, or one batched call over a SlotHost's slots
        finally:
            self.clock.enter(HOST)
        if critic is not None:
            value = float(self._value_out.reshape(-1)[0])
            st.value[...] = value
            threshold = self.config.value_threshold
            st.low[...] = st.low + 1 if threshold is not None and value < threshold else 0
        queue = st.queue
        queue[:] = self._chunk_out.reshape(queue.shape).cpu().numpy()
        st.pos[...], st.length[...] = 0, self.config.n_exec
        st.chunks[...] += 1
        self._first_bad = self._scan_queue()
        if self.observers:
            proposed = queue.copy()
            for observer in self.observers:
                observer.chunk(self, proposed)

    def _teleop_tick(self) -> Tick:
        """One step driven by the operator: recorded as an intervention; the policy's chunk is dropped."""
        self._poll_subtask()
        self.state.length[...] = 0  # after a human moved the robot, the policy plans afresh
        action = np.asarray(self.teleop(), np.float32).reshape(-1)
        if action.shape != self.low.shape or not np.all(np.isfinite(action)):
            raise SafetyStop(f"teleoperation sent {action.tolist()}; the env takes {self.low.shape[0]} finite numbers")
        action = np.minimum(np.maximum(action, self.low), self.high)
        tick = Tick(new_chunk=False, value=float("nan"), action=action, subtask_id=self._subtask_index,
                    intervention=True)
        self.clock.enter(STEP)
        try:
            tick.obs, tick.reward, tick.terminated, tick.truncated, tick.info = self.env.step(action)
        finally:
            self.clock.enter(HOST)
        if self.env.steps % self.config.planner_every == 0:
            self.planner.update(self.env)
        return tick

    def tick(self, obs: dict) -> Tick:
        """One control step of the chunk loop from observation `obs` (the env's current one).

        Reads the hand-off (a new subtask -> new language, new chunk), runs the lanes
        when the queue is empty, and executes the next queued action, clipped to the
        env's bounds. A low-value stop, when due, is reported before acting
        (`tick.low_value`, nothing executed).
        """
        return self._drive(self._tick(obs))

    def _tick(self, obs: dict) -> Generator:
        st, cfg = self.state, self.config
        if self._poll_subtask():
            st.length[...] = 0  # new language: new chunk now
        pos = int(st.pos)
        new_chunk = pos >= int(st.length)
        if new_chunk:
            yield from self._infer_steps(obs)
            pos = 0
            if cfg.value_threshold is not None and int(st.low) >= cfg.value_patience:
                return Tick(new_chunk=True, value=float(st.value), low_value=True)
        if pos >= self._first_bad:
            raise SafetyStop(f"policy proposed a non-finite action {st.queue[pos].tolist()}")
        proposed = st.queue[pos].copy()
        st.pos[...] = pos + 1
        action = np.minimum(np.maximum(proposed, self.low), self.high)
        tick = Tick(new_chunk, float(st.value), False, proposed, action, self._subtask_index)
        if self.safety_check is not None:
            self.safety_check(obs, action)
        lazy = self._lazy and pos + 1 < int(st.length)  # the next step executes a queued action: no image read
        if lazy:
            self.env.images_wanted = False
        self.clock.enter(STEP)
        try:
            tick.obs, tick.reward, tick.terminated, tick.truncated, tick.info = self.env.step(action)
        finally:
            self.clock.enter(HOST)
            if lazy:
                self.env.images_wanted = True
        if self.env.steps % cfg.planner_every == 0:
            self.planner.update(self.env)
        return tick

    def _loop(self, obs: dict, builder: EpisodeBuilder, limit: int) -> Generator:
        """Ticks until a stop; returns (stop reason, success, error)."""
        env, observers, control, polled = self.env, self.observers, self.control, self.state.polled
        images = () if self._branching else self._images  # a branch is not recorded: its images are not kept
        # a capsule taken at a chunk start holds the operator as it was after that step's poll: not polled again
        skip_poll = int(polled) == env.steps
        try:
            while True:
                if skip_poll:
                    skip_poll = False
                elif control.operator is not None:
                    stop = control.apply(env.steps, env)
                    polled[...] = env.steps
                    if stop:
                        return StopReason.SAFETY, False, "operator e-stop"
                tick = self._teleop_tick() if control.takeover else (yield from self._tick(obs))
                # an episode executes at least one step, so every stop is recorded
                if tick.low_value:
                    if len(builder):
                        return StopReason.LOW_VALUE, False, ""
                    self.state.low[...] = 0  # stop due before the first step: run the chunk anyway
                    continue
                t0 = perf_counter()
                builder.add(images={c: obs[k] for c, k in images}, state=obs[STATE_KEY], action=tick.action,
                            reward=tick.reward, policy_action=tick.proposed,
                            value=tick.value if tick.new_chunk else float("nan"),
                            subtask_id=tick.subtask_id, intervention=tick.intervention,
                            privileged=obs.get(PRIVILEGED))
                self.clock.add(RECORD_STEP, perf_counter() - t0)
                for observer in observers:
                    observer.step(self, tick)
                obs = tick.obs
                with self._lock:
                    end = self._end_request
                if env.success(tick.info):
                    return StopReason.SUCCESS, True, ""
                if end is not None:
                    return StopReason.OPERATOR_END, end, ""
                if tick.terminated:
                    return StopReason.TERMINATED, False, ""
                if tick.truncated or env.steps >= limit:
                    return StopReason.TIMEOUT, False, ""
        except SafetyStop as exc:
            return StopReason.SAFETY, False, str(exc) or "safety check stopped the episode"
        except Exception as exc:  # recorded (as an error, or the reason it names); the host stays usable
            self._exception = exc
            named = getattr(exc, "stop_reason", None)
            reason = StopReason(named) if named in STOP_REASONS else StopReason.ERROR
            return reason, False, describe(exc)[0]
