"""Run by LeRobot's own venv (not the project's): LeRobot's ACT and Diffusion Policy through `LeRobotPolicy`, for
tests/policies/test_lerobot_venv.py to judge. Writes a JSON of what it found.

usage: python lerobot_checks.py ACT_DIR DIFFUSION_DIR OUT.json
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch


def core_loads_no_lerobot(path: str) -> bool:
    """Importing the host's factory and describing a LeRobot checkpoint leaves LeRobot unimported."""
    from capsule_rollout.rollout.host_factory import RunSpec, check_spec, resolve_acting
    from capsule_rollout.rollout.rollout_host import HostConfig

    check_spec(RunSpec(env="tabletop:pick_place", policy=path, host=HostConfig(n_exec=resolve_acting(path)[0])))
    return "lerobot" not in sys.modules


def same_as_select_action(path: str, steps: int = 14) -> dict:
    """The adapter's actions on an episode's observations, and LeRobot's `select_action` (with its processors) on the
    same observations, the noise of each network call drawn from the generator the adapter uses for it."""
    from capsule_rollout.capsules import Arena
    from capsule_rollout.policies.conditioning import Conditioning
    from capsule_rollout.policies.lerobot_policy import row_generator
    from capsule_rollout.rollout.sources import load_source
    from capsule_rollout.tabletop.tabletop_env import TabletopEnv

    loaded = load_source(path, "policy", device="cpu", conditioning=Conditioning(), noise_scale=1.0)
    policy = loaded.part
    Arena([policy]).allocate()
    policy.reset(7)
    env = TabletopEnv("pick_place", cameras=loaded.cameras, image_size=loaded.image_size)
    obs, _ = env.reset(seed=4)
    observations, ours = [], []
    for _ in range(steps):
        observations.append(obs)
        policy.load_observation(obs)
        ours.append(policy.act()[0].clone())
        obs = env.step(ours[-1].numpy())[0]
    env.close()
    model = policy.model
    lerobot, calls = model.policy, [0]
    if model.samples:  # select_action draws from torch's global generator: hand it the adapter's instead
        sample = lerobot.diffusion.conditional_sample

        def seeded(batch_size, global_cond=None, generator=None, noise=None):
            calls[0] += 1
            return sample(batch_size, global_cond=global_cond, generator=row_generator(7, calls[0] - 1), noise=noise)

        lerobot.diffusion.conditional_sample = seeded
    lerobot.reset()
    theirs = []
    for o in observations:
        image = torch.from_numpy(o["image_front"])[None].permute(0, 3, 1, 2).contiguous().type(torch.float32) / 255
        batch = model.preprocessor({"observation.state": torch.from_numpy(o["state"])[None],
                                    "observation.images.front": image})
        theirs.append(model.postprocessor(lerobot.select_action(batch))[0])
    return {"equal": bool(torch.equal(torch.stack(ours), torch.stack(theirs))), "network_calls": policy.calls,
            "n_action_steps": model.n_action_steps, "n_obs_steps": model.n_obs_steps}


def mid_queue_in_slots(path: str, at: int = 3) -> dict:
    """3 slots, one model: slot 1's episode forked at step `at` (the queue part-used) into slot 2 with its own noise
    (the same actions), and with a branch's new noise (the queued actions the same, later ones not)."""
    from capsule_rollout.policies.lerobot_model import LeRobotModel
    from capsule_rollout.rollout.branching import BoundaryCapsules
    from capsule_rollout.rollout.host_factory import RunSpec, build_slots
    from capsule_rollout.rollout.rollout_host import HostConfig
    from capsule_rollout.rollout.slots.host import episode_job

    before = LeRobotModel.loaded
    slots = build_slots(RunSpec(env="tabletop:pick_place", policy=path, slots=3, host=HostConfig(n_exec=1,
                                                                                                  max_steps=24)))
    keeper = BoundaryCapsules((at,))
    slots.hosts[1].observers.append(keeper)
    results = slots.run_items([episode_job(seed) for seed in range(3)])
    episode = results[1].value.episode
    capsule = keeper.capsules[at]
    left = int(capsule.buffer("policy/queue_left")[0])
    same = slots.hosts[2].branch(capsule, seed=1)
    other = slots.hosts[0].branch(capsule, seed=1, noise_seed=12345)
    actions, same_a, other_a = (e.steps["action"] for e in (episode, same.episode, other.episode))
    out = {"models_loaded": LeRobotModel.loaded - before, "policy_instances": slots.report["policy_instances"],
           "mode": slots.policy_rows.mode,
           "record": results[0].value.extra["slots"], "queue_left_at_capsule": left,
           "fork_equal": bool(np.array_equal(same_a, actions[at:])),
           "new_noise_queued_equal": bool(np.array_equal(other_a[:left], actions[at: at + left])),
           "new_noise_later_differs": bool(not np.array_equal(other_a[left:], actions[at + left:]))}
    slots.close()
    return out


def main() -> int:
    act, diffusion, out = sys.argv[1:4]
    found = {"core_loads_no_lerobot": core_loads_no_lerobot(act)}
    for name, path in (("act", act), ("diffusion", diffusion)):
        found[name] = {"select_action": same_as_select_action(path), "slots": mid_queue_in_slots(path)}
    with open(out, "w") as f:
        json.dump(found, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
