"""Child process for the crash tests: appends episodes to a store until it is killed.

argv: store path, mode ("sigkill": loop until killed; "mid_append": exit inside the
append of episode N, after its data arrays are written but before its end is).
"""

import os
import sys

from capsule_rollout.stores import zarr_recorder
from tests.rollout.fakes import fake_episode

path, mode = sys.argv[1], sys.argv[2]
stop_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1

if mode == "mid_append":
    original = zarr_recorder.ZarrRecorder._commit

    def dying_commit(self, index, ends):  # data and metadata written, the commit point not
        if index == stop_at:
            os._exit(9)
        return original(self, index, ends)

    zarr_recorder.ZarrRecorder._commit = dying_commit

recorder = zarr_recorder.ZarrRecorder(path)
start = recorder.committed
for i in range(start, start + 500):  # bounded: the parent kills it long before
    recorder.write(fake_episode(i, length=40 + i % 7, image_size=96))
    recorder.flush()
    print(recorder.committed, flush=True)
