"""Branching from Python: play an episode in slot 0, keep the whole host's capsule mid-episode, and play K
continuations of it side by side in K env slots (forks of the one capsule, the policy batched over them). The
first keeps the episode's own noise and replays it bit for bit; the others draw noise of their own.
`python -m examples.branch_from_python`"""
import numpy as np

from capsule_rollout.rollout import BoundaryCapsules, HostConfig, RunSpec, branch_job, build_slots, episode_job, with_kwargs

K, STEP, SEED = 4, 16, 3  # slots (continuations), the chunk start branched from (a multiple of n_exec), the seed
ENV = with_kwargs("examples.own_env_and_policy:make_env", steps=100)  # a factory called with keyword arguments
POLICY = "examples.own_env_and_policy:make_policy"


def branch(k: int) -> dict:
    """Play the episode, then K continuations from its capsule at STEP; what each continuation did."""
    slots = build_slots(RunSpec(env=ENV, policy=POLICY, slots=k, host=HostConfig(n_exec=8)))
    keeper = BoundaryCapsules(steps=[STEP])  # an observer: the host's capsule at that chunk start
    slots.observe(keeper, [0])
    try:
        [played] = slots.run_items([episode_job(SEED)])  # the episode, in slot 0
        keeper.enabled = False  # the branches' own boundaries are not kept
        capsule, episode = keeper.capsules[STEP], played.value.episode
        # continuation 0 with the episode's noise (None), the others with noise seeds of their own
        jobs = [branch_job(capsule, seed=SEED, noise_seed=None if i == 0 else i) for i in range(k)]
        results = [r.value.episode for r in slots.run_items(jobs)]  # one per slot, side by side
    finally:
        slots.close()
    replayed = np.array_equal(results[0].steps["action"], episode.steps["action"][STEP:])
    return {"replayed": replayed, "outcomes": [(e.meta.stop_reason, e.meta.length) for e in results[1:]]}


if __name__ == "__main__":
    found = branch(K)
    print("continuation 0 replays the episode bit for bit:", found["replayed"])
    for i, (reason, length) in enumerate(found["outcomes"], start=1):
        print(f"continuation {i}: {reason} after {length} more steps")
