"""LeRobot dataset format v3.0: its paths and keys, and how the project's episode fields map onto them.

A v3.0 dataset (what LeRobot 0.4's `LeRobotDataset(repo_id, root=DIR)` opens):

  meta/info.json                      codebase_version "v3.0", fps, features (dtype, shape, names), totals,
                                      path templates, file size limits
  meta/stats.json                     per feature: min, max, mean, std, count, q01, q10, q50, q90, q99
  meta/tasks.parquet                  task_index, indexed by the task text (pandas index "task")
  meta/subtasks.parquet               subtask_index, indexed by the subtask text
  meta/episodes/chunk-000/file-000.parquet
                                      one row per episode: episode_index, tasks, length, the data and video
                                      file each lives in, its rows (dataset_from_index..dataset_to_index),
                                      its video span (from_timestamp..to_timestamp), stats/<feature>/<stat>
  data/chunk-000/file-000.parquet     one row per frame, many episodes per file
  videos/<key>/chunk-000/file-000.mp4 one stream per camera, episodes back to back, frame k at k / fps

Frame columns: `observation.state`, `action`, `observation.images.<camera>` (a video, or PNG bytes in
the parquet), `timestamp` (seconds since the episode's start, frame_index / fps), `frame_index`,
`episode_index`, `index` (frame number in the dataset), `task_index` (the episode's instruction),
`subtask_index` (into meta/subtasks.parquet), and the project's own per-step fields under their
schema names (`reward`, `done`, `value`, `intervention`, `subtask_id`, `policy_action`), with the
store's wall-clock `timestamp` as `wall_time`. The per-episode fields of the schema are columns of
the episodes table under their own names (`instruction` is the episode's task).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from capsule_rollout.extras import MissingExtraError, install_command
from capsule_rollout.stores import episode_schema as S

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
SUBTASKS_PATH = "meta/subtasks.parquet"
EPISODES_DIR = "meta/episodes"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
EPISODES_PATH = EPISODES_DIR + "/" + CHUNK_FILE + ".parquet"
CHUNKS_SIZE = 1000  # files per chunk directory (LeRobot's default)
DATA_FILE_MB = 100  # a data file is closed once it holds about this much (LeRobot's default)
VIDEO_FILE_MB = 200  # likewise for a video file
EPISODES_PER_META_FILE = 10_000  # rows per meta/episodes file

# LeRobot's frame keys
OBS_STATE = "observation.state"
ACTION = "action"
IMAGES_PREFIX = "observation.images."
TIMESTAMP = "timestamp"
FRAME_INDEX = "frame_index"
EPISODE_INDEX = "episode_index"
INDEX = "index"
TASK_INDEX = "task_index"
SUBTASK_INDEX = "subtask_index"
INDEX_FEATURES = (TIMESTAMP, FRAME_INDEX, EPISODE_INDEX, INDEX, TASK_INDEX)
# LeRobot's names for reward and done in datasets made by its own tools (read on import)
NEXT_REWARD = "next.reward"
NEXT_DONE = "next.done"
NEXT_SUCCESS = "next.success"

# LeRobot's episode columns
TASKS = "tasks"
LENGTH = "length"
FROM_INDEX = "dataset_from_index"
TO_INDEX = "dataset_to_index"
DATA_CHUNK = "data/chunk_index"
DATA_FILE = "data/file_index"
META_CHUNK = "meta/episodes/chunk_index"
META_FILE = "meta/episodes/file_index"
STATS_PREFIX = "stats/"

# The project's fields under their own names
WALL_TIME = "wall_time"  # the store's `timestamp` (unix seconds); LeRobot's `timestamp` is episode time
STEP_EXTRAS = (S.REWARD, S.DONE, S.VALUE, S.INTERVENTION, S.SUBTASK_ID, S.POLICY_ACTION, S.PRIVILEGED)
EPISODE_EXTRAS = (S.EPISODE_ID, S.SEED, S.TASK, S.SUBTASKS, S.SUCCESS, S.STOP_REASON,
                  S.INITIAL_CAPSULE_ID, S.OPERATOR_EVENTS, S.ATTEMPT, S.REPEAT)
IMAGE_NAMES = ["height", "width", "channels"]


class LeRobotFormatError(ValueError):
    """A directory is not a LeRobot v3.0 dataset this project can read; the message says what is wrong."""


def require_optional():
    """(av, pyarrow, pyarrow.parquet, PIL.Image): the optional libraries the LeRobot format needs."""
    try:
        import av
        import pyarrow
        import pyarrow.parquet
        from PIL import Image
    except ImportError as exc:
        raise MissingExtraError(
            f"the LeRobot format needs pyarrow, PyAV and Pillow ({exc}); install them: {install_command('lerobot')}"
        ) from None
    return av, pyarrow, pyarrow.parquet, Image


def video_key(camera: str) -> str:
    return IMAGES_PREFIX + camera


def feature_key(step_key: str) -> str:
    """The LeRobot feature a per-step field of the store is written as."""
    if step_key.startswith(S.IMAGE_PREFIX):
        return video_key(step_key[len(S.IMAGE_PREFIX):])
    return {S.STATE: OBS_STATE, S.ACTION: ACTION, S.TIMESTAMP: WALL_TIME}.get(step_key, step_key)


def step_key(feature: str) -> str | None:
    """The store's per-step field a LeRobot feature is read into (None: not one of the schema's)."""
    if feature.startswith(IMAGES_PREFIX):
        return S.IMAGE_PREFIX + feature[len(IMAGES_PREFIX):]
    key = {OBS_STATE: S.STATE, ACTION: S.ACTION, WALL_TIME: S.TIMESTAMP}.get(feature, feature)
    return key if key in S.STEP_FIELDS or key.startswith(S.IMAGE_PREFIX) else None


def chunk_file(file_number: int, chunks_size: int = CHUNKS_SIZE) -> dict[str, int]:
    """The n-th file of a series as LeRobot numbers it: `chunks_size` files per chunk directory."""
    return {"chunk_index": file_number // chunks_size, "file_index": file_number % chunks_size}


def select_episodes(ids: Sequence[str], wanted: Sequence[str]) -> list[int]:
    """Positions of the `wanted` episodes (ids, or indices into `ids`), in order; all when none are named."""
    if not wanted:
        return list(range(len(ids)))
    position = {episode_id: i for i, episode_id in enumerate(ids)}
    chosen = set()
    for name in wanted:
        if name in position:
            chosen.add(position[name])
        elif name.lstrip("-").isdigit() and -len(ids) <= int(name) < len(ids):
            chosen.add(int(name) % len(ids))
        else:
            close = difflib.get_close_matches(name, list(ids), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (e.g. {list(ids[:2])} or 0..{len(ids) - 1})"
            raise ValueError(f"episode {name!r} is neither an id nor an index of the {len(ids)} episodes{hint}")
    return sorted(chosen)
