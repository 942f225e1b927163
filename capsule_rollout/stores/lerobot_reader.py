"""`LeRobotDatasetReader`: the episodes of a local LeRobot v3.0 dataset in the project's episode schema.

Reads what `LeRobotWriter` writes, field for field, and datasets made by LeRobot's own tools:
`observation.state` and `action` are required; `observation.images.<camera>` (video or images)
become `image_<camera>`; the schema's per-step fields are read under their own names
(`next.reward` stands in for `reward`), and what a dataset lacks gets the schema's empty value
(no value: NaN; no policy action: NaN; no intervention). The instruction is the episode's task;
subtask texts come from `subtasks` or from the frames' `subtask_index`. Episode ids, seeds and
outcomes come from the episodes table where it has them, else `<prefix>-e<episode_index>`, the
episode index, and `next.success` on the last frame (or unknown: not a success, ended by the operator).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores import lerobot_format as F
from capsule_rollout.stores.episode import Episode, EpisodeMeta, validate_episode
from capsule_rollout.stores.lerobot_checksums import DatasetChecksums
from capsule_rollout.stores.store_damage import StoreDamageError, UnverifiedStoreError, episode_label


class LeRobotDatasetReader:
    """Read-only view of a LeRobot v3.0 dataset directory; `episode(i)` is a validated `Episode`.

    A dataset `export_lerobot` wrote carries checksums (`stores.lerobot_checksums`): its metadata files are
    checked on opening, each episode's frame columns and video files when it is read, and what differs or is
    missing raises `StoreDamageError` naming the dataset, the episode and the feature or file.
    """

    def __init__(self, root: str | os.PathLike, *, id_prefix: str | None = None) -> None:
        self.av, self.pa, self.pq, self.Image = F.require_optional()
        self.root = Path(root)
        self.checksums = DatasetChecksums(self.root)
        damaged = {rel: why for rel in (self.checksums.files or {}) if rel.startswith("meta/")
                   and (why := self.checksums.check_file(rel)) is not None}
        if damaged:
            raise StoreDamageError(self.root, "every episode", damaged)
        info_path = self.root / F.INFO_PATH
        if not info_path.is_file():
            raise F.LeRobotFormatError(f"{self.root} is not a LeRobot dataset: it has no {F.INFO_PATH}")
        try:
            self.info = json.loads(info_path.read_text())
        except ValueError as exc:  # checked above when the dataset has checksums
            raise StoreDamageError(self.root, "every episode", {F.INFO_PATH: f"cannot be read ({exc})"}) from exc
        version = str(self.info.get("codebase_version", "?"))
        if not version.startswith("v3."):
            raise F.LeRobotFormatError(
                f"{self.root} is a LeRobot {version} dataset; this reader reads v3.0 (convert it with LeRobot's "
                "`python -m lerobot.datasets.v30.convert_dataset_v21_to_v30`)")
        self.features: dict[str, dict] = self.info["features"]
        missing = [k for k in (F.OBS_STATE, F.ACTION) if k not in self.features]
        if missing:
            raise F.LeRobotFormatError(f"{self.root} has no {missing} feature(s); the project's episodes need both")
        self.fps = int(self.info["fps"])
        self.cameras = [k for k, ft in self.features.items() if ft["dtype"] in ("video", "image")
                        and k.startswith(F.IMAGES_PREFIX)]
        self.tasks = self._texts(F.TASKS_PATH, F.TASK_INDEX)
        self.subtasks = self._texts(F.SUBTASKS_PATH, F.SUBTASK_INDEX) if (self.root / F.SUBTASKS_PATH).exists() else []
        self.rows = self._episode_rows()
        self.id_prefix = (id_prefix or self.root.name)[:40]
        self._data: tuple[Path, dict[str, np.ndarray], object] | None = None
        self._videos: dict[str, _VideoCursor] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def episode_id(self, index: int) -> str:
        return self._row_id(self.rows[index])

    def _row_id(self, row: dict) -> str:
        return str(row.get(S.EPISODE_ID) or f"{self.id_prefix}-e{row[F.EPISODE_INDEX]:06d}")

    def _damage(self, row: dict, problems: dict[str, str]) -> StoreDamageError:
        return StoreDamageError(self.root, episode_label(self._row_id(row), row[F.EPISODE_INDEX]), problems)

    def episodes(self) -> Iterator[Episode]:
        for i in range(len(self)):
            yield self.episode(i)

    @property
    def verified(self) -> bool:
        """Whether the dataset carries checksums its reads are checked against."""
        return self.checksums.verified

    def require_verified(self) -> None:
        """Refuse a dataset without checksums (made by other tools) with `UnverifiedStoreError`."""
        if not self.verified:
            labels = [episode_label(self.episode_id(i), i) for i in range(len(self))]
            raise UnverifiedStoreError(self.root, labels, len(self))

    def episode(self, index: int) -> Episode:
        row = self.rows[index]
        columns, images = self._frames(row)
        damaged = self.checksums.check_columns(row[F.EPISODE_INDEX], {**columns, **images})
        if damaged:
            raise self._damage(row, damaged)
        steps = self._steps(row, columns, images)
        return validate_episode(Episode(steps, self._meta(row, columns, index)))

    def close(self) -> None:
        for cursor in self._videos.values():
            cursor.close()
        self._videos.clear()

    # -- tables ---------------------------------------------------------------------
    def _texts(self, path: str, column: str) -> list[str]:
        """Texts by index from tasks.parquet / subtasks.parquet (the text is whichever column is a string)."""
        if not (self.root / path).exists():
            raise F.LeRobotFormatError(f"{self.root} has no {path}")
        table = self._table(self.root / path)
        text = [n for n, t in zip(table.column_names, table.schema.types) if self.pa.types.is_string(t)
                or self.pa.types.is_large_string(t)]
        if column not in table.column_names or not text:
            raise F.LeRobotFormatError(f"{self.root / path} has no {column} and text columns")
        out = [""] * len(table)
        for i, t in zip(table[column].to_pylist(), table[text[0]].to_pylist()):
            out[i] = t
        return out

    def _episode_rows(self) -> list[dict]:
        paths = sorted((self.root / F.EPISODES_DIR).glob("*/*.parquet"))
        if not paths:
            raise F.LeRobotFormatError(f"{self.root} has no episode table ({F.EPISODES_DIR}/*/*.parquet)")
        rows = []
        for path in paths:
            table = self._table(path)
            keep = [c for c in table.column_names if not c.startswith(F.STATS_PREFIX)]
            rows += table.select(keep).to_pylist()
        return sorted(rows, key=lambda r: r[F.EPISODE_INDEX])

    def _table(self, path: Path):
        """A metadata table (checked on opening when the dataset has checksums); one that cannot be read is
        damage of every episode, named by its file."""
        try:
            return self.pq.read_table(path)
        except (OSError, self.pa.ArrowException) as exc:
            rel = path.relative_to(self.root).as_posix()
            raise StoreDamageError(self.root, "every episode", {rel: f"cannot be read ({type(exc).__name__}: "
                                                                     f"{exc})"}) from exc

    def _data_file(self, row: dict) -> str:
        return self.info["data_path"].format(chunk_index=row[F.DATA_CHUNK], file_index=row[F.DATA_FILE])

    def _frames(self, row: dict) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The episode's frame columns (numpy) and its camera images (T, H, W, 3) uint8."""
        path = self.root / self._data_file(row)
        if not path.is_file() and self.checksums.verified:
            raise self._damage(row, {self._data_file(row): "the file is missing"})
        rel = self._data_file(row)
        if self._data is None or self._data[0] != path:
            try:
                table = self.pq.read_table(path)
                self._data = (path, {name: self._column(table, name) for name in table.column_names
                                     if self.features.get(name, {}).get("dtype") != "image"}, table)
            except (OSError, ValueError, self.pa.ArrowException) as exc:  # a damaged parquet file
                raise self._damage(row, {rel: self._why(rel, f"cannot be read ({type(exc).__name__}: {exc})")}) from exc
        _, data, table = self._data
        rows = np.flatnonzero(data[F.EPISODE_INDEX] == row[F.EPISODE_INDEX])
        order = rows[np.argsort(data[F.FRAME_INDEX][rows], kind="stable")] if F.FRAME_INDEX in data else rows
        if len(order) != row[F.LENGTH]:
            raise self._damage(row, {rel: self._why(rel, f"holds {len(order)} frames of the episode, its metadata "
                                                         f"says {row[F.LENGTH]}")})
        columns = {name: values[order] for name, values in data.items()}
        images = {}
        for key in self.cameras:
            if self.features[key]["dtype"] == "video":
                images[key] = self._video_frames(row, key)
            else:
                cells = table[key].take(self.pa.array(order)).to_pylist()
                images[key] = np.stack([self._decode_png(row, cell, key, frame) for frame, cell in enumerate(cells)])
        return columns, images

    def _why(self, rel: str, what: str) -> str:
        """`what` is wrong with file `rel`, and whether it differs from what was written (when that is known)."""
        differs = self.checksums.check_file(rel)
        return f"{rel}: {what}" + (f"; {differs.removeprefix(f'{rel}: ')}" if differs else "")

    def _column(self, table, name: str) -> np.ndarray:
        column = table[name].combine_chunks()
        if self.pa.types.is_list(column.type) or self.pa.types.is_fixed_size_list(column.type):
            width = int(np.prod(self.features[name]["shape"]))
            return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)
        return column.to_numpy(zero_copy_only=False)

    def _decode_png(self, row: dict, cell: dict, key: str, frame: int) -> np.ndarray:
        """Frame `frame`'s image of camera `key` (H, W, 3) uint8: PNG bytes in the data file, or a file of its own.
        One that cannot be decoded, or decodes to another shape, is damage naming the episode, frame and file."""
        rel = cell.get("path") or self._data_file(row)
        try:
            if cell.get("bytes") is not None:
                from io import BytesIO

                image = np.asarray(self.Image.open(BytesIO(cell["bytes"])).convert("RGB"))
            elif cell.get("path"):
                image = np.asarray(self.Image.open(self.root / cell["path"]).convert("RGB"))
            else:
                raise ValueError("the image has neither bytes nor a path")
        except Exception as exc:  # noqa: BLE001 - whatever the decoder raises is the finding, named
            what = ("not an image Pillow can identify" if isinstance(exc, self.Image.UnidentifiedImageError)
                    else f"{type(exc).__name__}: {exc}")
            raise self._damage(row, {key: self._why(rel, f"the image of frame {frame} cannot be decoded ({what})")}) from exc
        shape = tuple(self.features[key].get("shape") or image.shape)
        if image.shape != shape:
            raise self._damage(row, {key: self._why(rel, f"the image of frame {frame} decodes to {image.shape}, the "
                                                         f"feature is {shape}")})
        return image

    def _video_frames(self, row: dict, key: str) -> np.ndarray:
        prefix = f"videos/{key}/"
        rel = self.info["video_path"].format(
            video_key=key, chunk_index=row[prefix + "chunk_index"], file_index=row[prefix + "file_index"])
        path, why = self.root / rel, self.checksums.check_file(rel)
        if why is not None:
            raise self._damage(row, {key: f"video {why}"})
        cursor = self._videos.setdefault(key, _VideoCursor(self.av, self.fps))
        first = round(row[prefix + "from_timestamp"] * self.fps)
        try:
            return cursor.frames(path, first, first + row[F.LENGTH])
        except (self.av.FFmpegError, F.LeRobotFormatError, ValueError) as exc:  # a damaged video (checked above
            cursor.close()  # when the dataset has checksums), or one short of frames
            raise self._damage(row, {key: f"video {rel} cannot be decoded ({type(exc).__name__}: {exc})"}) from exc

    # -- schema ---------------------------------------------------------------------
    def _steps(self, row: dict, columns: dict[str, np.ndarray], images: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        T = row[F.LENGTH]
        state = columns[F.OBS_STATE].reshape(T, -1).astype(np.float32)
        action = columns[F.ACTION].reshape(T, -1).astype(np.float32)

        def scalar(*names: str, default, dtype) -> np.ndarray:
            for name in names:
                if name in columns:
                    return columns[name].reshape(T).astype(dtype)
            return np.full(T, default, dtype=dtype)

        done = np.zeros(T, np.bool_)
        done[-1] = True  # the schema's rule, whatever a dataset's own done flags say
        steps = {
            S.STATE: state,
            S.ACTION: action,
            S.POLICY_ACTION: (columns[S.POLICY_ACTION].reshape(T, -1).astype(np.float32) if S.POLICY_ACTION in columns
                              else np.full_like(action, np.nan)),
            S.VALUE: scalar(S.VALUE, default=np.nan, dtype=np.float32),
            S.REWARD: scalar(S.REWARD, F.NEXT_REWARD, default=0.0, dtype=np.float32),
            S.DONE: done,
            S.INTERVENTION: scalar(S.INTERVENTION, default=False, dtype=np.bool_),
            S.SUBTASK_ID: self._subtask_ids(row, columns),
            S.TIMESTAMP: scalar(F.WALL_TIME, F.TIMESTAMP, default=0.0, dtype=np.float64),
        }
        if S.PRIVILEGED in columns:  # a sim's episode (exported by this project): its privileged state
            steps[S.PRIVILEGED] = columns[S.PRIVILEGED].reshape(T, -1).astype(np.float32)
        for key, frames in images.items():
            steps[F.step_key(key)] = frames
        return steps

    def _subtask_ids(self, row: dict, columns: dict[str, np.ndarray]) -> np.ndarray:
        T = row[F.LENGTH]
        if S.SUBTASK_ID in columns:
            return columns[S.SUBTASK_ID].reshape(T).astype(np.int32)
        if F.SUBTASK_INDEX in columns and self.subtasks:
            texts = self._episode_subtasks(row, columns)
            position = {t: i for i, t in enumerate(texts)}
            return np.array([position[self.subtasks[i]] for i in columns[F.SUBTASK_INDEX].reshape(T)], np.int32)
        return np.zeros(T, np.int32)

    def _episode_subtasks(self, row: dict, columns: dict[str, np.ndarray]) -> list[str]:
        if row.get(S.SUBTASKS) is not None:
            return row[S.SUBTASKS].split(S.SUBTASK_SEPARATOR) if row[S.SUBTASKS] else []
        if F.SUBTASK_INDEX in columns and self.subtasks:
            seen = dict.fromkeys(int(i) for i in columns[F.SUBTASK_INDEX].reshape(-1))
            return [self.subtasks[i] for i in seen]
        return []

    def _meta(self, row: dict, columns: dict[str, np.ndarray], index: int) -> EpisodeMeta:
        if row.get(F.TASKS):
            instruction = row[F.TASKS][0]
        elif F.TASK_INDEX in columns:
            instruction = self.tasks[int(columns[F.TASK_INDEX][0])]
        else:
            instruction = ""
        success = row.get(S.SUCCESS)
        if success is None:
            success = bool(columns[F.NEXT_SUCCESS].reshape(-1)[-1]) if F.NEXT_SUCCESS in columns else False
        subtasks = self._episode_subtasks(row, columns)
        return EpisodeMeta(
            episode_id=self.episode_id(index),
            seed=int(row[S.SEED]) if row.get(S.SEED) is not None else int(row[F.EPISODE_INDEX]),
            task=str(row.get(S.TASK) or self.info.get("robot_type") or "lerobot")[: S.EPISODE_FIELDS[S.TASK].itemsize // 4],
            instruction=instruction,
            success=bool(success),
            stop_reason=row.get(S.STOP_REASON) or ("success" if success else "operator_end"),
            length=int(row[F.LENGTH]),
            initial_capsule_id=row.get(S.INITIAL_CAPSULE_ID) or "",
            subtasks=S.SUBTASK_SEPARATOR.join(subtasks),
            operator_events=row.get(S.OPERATOR_EVENTS) or "",
            attempt=int(row.get(S.ATTEMPT) or 0),
            repeat=int(row.get(S.REPEAT) or 0),
        )


class _VideoCursor:
    """Decodes one camera's video files forward, seeking only when a request starts before the cursor."""

    def __init__(self, av, fps: int) -> None:
        self.av, self.fps = av, fps
        self.path: Path | None = None
        self.container = self.stream = self.decoded = None
        self.next_frame = 0
        self.pending = None  # a frame decoded past the previous request's end
        self.to_rgb = av.video.reformatter.VideoReformatter()  # one converter for every frame (5x faster)

    def frames(self, path: Path, first: int, end: int) -> np.ndarray:
        """Frames first .. end-1 of the file (numbered by time: frame k at k / fps) as (n, H, W, 3) uint8."""
        if path != self.path or first < self.next_frame:
            self._open(path, first)
        out = []
        while (frame := self._next_decoded()) is not None:
            k = round(float(frame.pts * self.stream.time_base) * self.fps)
            if k < first:
                continue
            if k >= end:
                self.pending = frame
                break
            out.append(self.to_rgb.reformat(frame, format="rgb24").to_ndarray())
        self.next_frame = end
        if len(out) != end - first:
            raise F.LeRobotFormatError(f"{path} holds {len(out)} frames for {first}..{end - 1}, expected {end - first}")
        return np.stack(out)

    def _next_decoded(self):
        if self.pending is not None:
            frame, self.pending = self.pending, None
            return frame
        return next(self.decoded, None)

    def _open(self, path: Path, first: int) -> None:
        if path != self.path:
            self.close()
            if not path.is_file():
                raise F.LeRobotFormatError(f"video {path} is missing")
            self.container = self.av.open(str(path))
            self.stream = self.container.streams.video[0]
            self.path = path
        self.container.seek(int(first / self.fps / self.stream.time_base), stream=self.stream, backward=True)
        self.decoded, self.pending = self.container.decode(self.stream), None

    def close(self) -> None:
        if self.container is not None:
            self.container.close()
        self.container = self.stream = self.decoded = self.path = None
        self.pending = None
