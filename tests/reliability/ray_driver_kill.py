"""Child process for the driver-kill test: starts a local Ray with `init_ray`, plays tiny-checkpoint episodes
on two actors with `run_rollouts`, and once the first episode is back prints one JSON line (its pid and
where Ray runs) and stops in the middle of the run, waiting to be SIGKILLed by the test.

argv: WORKDIR (the checkpoints go there)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_rollout import init_ray, run_rollouts
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from tests.policies.tiny import save_tiny_checkpoints


def main(workdir: str) -> None:
    policy, critic = save_tiny_checkpoints(Path(workdir) / "ckpt")
    spec = RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, host=HostConfig(n_exec=2, max_steps=6))
    where = init_ray(num_cpus=2)

    def on_report(report, stats) -> None:
        print(json.dumps({"driver": os.getpid(), "where": where}), flush=True)
        time.sleep(3600)  # mid-run: the other actor holds a call, more items are queued

    items = [WorkItem(f"pick_place-s{s:07d}", s) for s in range(1_000_000, 1_000_008)]
    run_rollouts(spec, items, actors=2, on_report=on_report)


if __name__ == "__main__":
    main(sys.argv[1])
