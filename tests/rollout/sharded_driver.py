"""Child process for the sharded driver tests: `run_rollouts` in this process (no Ray) into a sharded store, with
an actor that exits the process once VICTIM is in its shard, before the commit (`tests.rollout.faults`).

argv: POLICY CRITIC ROOT EPISODES VICTIM MARKER
"""

import sys

from capsule_rollout.rollout.host_factory import RunSpec
from capsule_rollout.rollout.ray_rollout import run_rollouts
from capsule_rollout.rollout.rollout_actor import WorkItem
from capsule_rollout.rollout.rollout_host import HostConfig
from capsule_rollout.stores.sharded_store import ShardedStore
from tests.rollout.faults import ExitAfterRecord

policy, critic, root, episodes, victim, marker = sys.argv[1:7]
spec = RunSpec(env="tabletop:pick_place", policy=policy, critic=critic, host=HostConfig(n_exec=2, max_steps=6))
victim_actor = type("VictimActor", (ExitAfterRecord,), {"victim": victim, "marker": marker})
items = [WorkItem(f"pick_place-s{s:07d}", s) for s in range(1_000_000, 1_000_000 + int(episodes))]
with ShardedStore(root) as store:
    run_rollouts(spec, items, actors=0, recorder=store, done=store.outcomes(), actor_cls=victim_actor)
