"""A LeRobot policy (ACT or Diffusion Policy, trained by `lerobot-train` on an `export_lerobot` dataset) rolled out
in the tabletop it was trained for: 4 env slots served by one model, each step one batched call, then an episode
restored in the middle of the policy's action queue and played on in another slot, bit for bit. In LeRobot's venv:
`python -m examples.lerobot_policy outputs/train/act/checkpoints/last/pretrained_model`."""
import sys

import numpy as np

from capsule_rollout.rollout import BoundaryCapsules, HostConfig, RunSpec, build_slots, episode_job


def main(checkpoint: str, episodes: int = 4) -> None:
    # the directory is recognised as LeRobot's (config.json, model.safetensors); one action a step, as select_action
    slots = build_slots(RunSpec(env="tabletop:pick_place", policy=checkpoint, slots=4, host=HostConfig(n_exec=1)))
    keeper = BoundaryCapsules((3,))  # step 3: actions of the policy's first network call are still queued
    slots.observe(keeper, [1])
    results = slots.run_items([episode_job(seed) for seed in range(episodes)])  # seed s starts in slot s
    wins = sum(r.value.episode.meta.success for r in results)
    print(f"{wins}/{episodes} successes; {slots.report['policy_instances']} policy instance for {slots.slots} slots, "
          f"{slots.calls} batched calls")
    episode = results[1].value.episode
    again = slots.branch(3, keeper.capsules[3], seed=1)  # slot 1's episode, forked into slot 3
    same = np.array_equal(again.episode.steps["action"], episode.steps["action"][3:])
    print("restored mid-queue into slot 3, the actions that follow are the episode's bit for bit:", same)
    slots.close()


if __name__ == "__main__":
    main(sys.argv[1])
