"""A policy that keeps state across calls (a two-frame history and a queue of planned actions), restored bit
for bit with nothing declared: the host captures the object's state in every capsule, so a restore in the middle
of its queue, a fork into another env slot and a replay all play on as the episode did.
`python -m examples.stateful_policy` (4 env slots, episodes restored mid-queue and compared)."""
from collections import deque

import numpy as np


class HistoryAndQueue:
    """Plans 8 actions from the last two states (a velocity estimate) and hands them out 4 per call."""
    chunk_length = 4
    observation_keys = ("state",)  # what it reads: no camera is rendered for it

    def __init__(self):
        self.history = deque(maxlen=2)  # the last two states seen
        self.queue = deque()  # planned actions not handed out yet

    def reset(self):  # called at every episode start
        self.history.clear()
        self.queue.clear()

    def infer(self, obs, *, noise):
        s = np.asarray(obs["state"], np.float64)
        self.history.append(s)
        velocity = self.history[-1][:2] - self.history[0][:2]
        if not self.queue:  # plan two chunks: toward the goal, damped by the estimated velocity
            push = 3.0 * (s[4:6] - s[0:2]) - 20.0 * velocity
            plan = [np.clip(push * 0.9 ** t + 0.2 * noise[t % 4], -1.0, 1.0) for t in range(8)]
            self.queue.extend(plan)
        return np.stack([self.queue.popleft() for _ in range(self.chunk_length)]).astype(np.float32)


make_policy = HistoryAndQueue


if __name__ == "__main__":
    from capsule_rollout.rollout import BoundaryCapsules, HostConfig, RunSpec, build_slots, episode_job
    me = __spec__.name
    slots = build_slots(RunSpec(env="examples.own_env_and_policy:make_env", policy=f"{me}:make_policy", slots=4,
                                 host=HostConfig(n_exec=4)))
    keeper = BoundaryCapsules((4,))  # step 4: the first chunk of a plan handed out, the second still queued
    slots.observe(keeper, [1])
    played = {r.slot: r.value for r in slots.run_items([episode_job(s) for s in range(4)])}
    capsule, episode = keeper.capsules[4], played[1].episode
    again = slots.branch(3, capsule, seed=episode.meta.seed)  # restored into another slot, mid-queue
    same = np.array_equal(again.episode.steps["action"], episode.steps["action"][4:])
    print("a fork into slot 3 plays slot 1's episode on bit for bit:", same)
    slots.close()
