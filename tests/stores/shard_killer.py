"""Child process for the sharded-store kill tests: a writer (or a whole driver) that dies between writing an
episode to its shard and the manifest commit of that episode.

argv: MODE ROOT FIRST COUNT
- `actor`: writes fake episodes FIRST..FIRST+COUNT-1 to a new shard of the store at ROOT, printing each one's
  manifest entry (JSON) once it is in the shard, as an actor returns it to the driver; after writing the last
  one it exits (status 9) before printing it: the driver never hears of that episode.
- `driver`: opens the store as its driver, writes the same episodes to its own shard and commits each; the
  last one is written to the shard and the process exits (status 9) before committing it.
"""

import dataclasses
import json
import os
import sys

from capsule_rollout.stores.sharded_store import ShardedStore, ShardWriter
from tests.rollout.fakes import fake_episode

mode, root, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
store = ShardedStore(root) if mode == "driver" else None
writer = ShardWriter(root, prefix="killed")
for i in range(first, first + count):
    entry = writer.write(fake_episode(i, length=5 + i % 4))
    if i == first + count - 1:
        os._exit(9)  # in the shard, not in the manifest
    if store is not None:
        store.commit(entry)
    else:
        print(json.dumps(dataclasses.asdict(entry)), flush=True)
