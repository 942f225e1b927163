"""`LeRobotWriter`: episodes of the project's schema as a LeRobot v3.0 dataset (layout in `lerobot_format`).

Frames go to parquet with pyarrow, camera images to one mp4 stream per camera with PyAV (episodes
back to back, frame k at k / fps, as LeRobot's decoders expect) or, without video, to PNG bytes in
the parquet. `export_lerobot` writes a whole dataset into a temporary directory and renames it into
place when complete, so a directory at the destination is always a finished export.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType

import numpy as np

from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores import lerobot_format as F
from capsule_rollout.stores import lerobot_stats
from capsule_rollout.stores.episode import Episode
from capsule_rollout.stores.lerobot_checksums import CHECKSUMS_PATH, INFO_KEY, column_checksums, write_checksums
from capsule_rollout.stores.sharded_reader import open_episode_reader
from capsule_rollout.stores.store_damage import StoreDamageError
from capsule_rollout.stores.zarr_reader import EpisodeReader

VIDEO_CODECS = ("h264", "libsvtav1", "hevc")  # LeRobot's software encoders (its own default is libsvtav1)
ROW_GROUP_BYTES = 32 << 20  # frames buffered before a parquet row group is written


class LeRobotExportError(ValueError):
    """The episodes cannot be written as asked; the message says how to fix it."""


@dataclass(frozen=True)
class LeRobotWriterOptions:
    fps: int
    """Frames per second (the control rate the episodes were recorded at)."""
    video: bool = True
    """Camera images as mp4 videos (LeRobot's default); False: PNG images inside the parquet files."""
    vcodec: str = "h264"
    """Video encoder: h264, libsvtav1 (AV1) or hevc."""
    crf: int = 18
    """Encoder quality (constant rate factor: lower is better and larger)."""
    gop: int = 2
    """Frames between key frames (LeRobot uses 2: random access costs at most one extra frame)."""
    svt_preset: int = 6
    """libsvtav1's speed preset. LeRobot records with 12; presets 7 and up left the motion out of some
    frames of the tabletop's 64x64 images, about half of them at 12 (docs/BENCHMARKS.md, `bench_lerobot`)."""
    robot_type: str | None = None
    """`robot_type` in info.json."""
    names: Mapping[str, Sequence[str]] = field(default_factory=lambda: MappingProxyType({}))
    """Names of the dimensions of vector features (e.g. observation.state), where known."""
    data_file_mb: float = F.DATA_FILE_MB
    """A data parquet file is closed once it holds about this many MB (of frames in memory)."""
    video_file_mb: float = F.VIDEO_FILE_MB
    """A video file is closed once it holds about this many MB."""

    def __post_init__(self) -> None:
        if not isinstance(self.fps, int) or self.fps < 1:
            raise LeRobotExportError(f"fps must be a positive integer (LeRobot stores it as one), got {self.fps!r}")
        if self.vcodec not in VIDEO_CODECS:
            raise LeRobotExportError(f"vcodec {self.vcodec!r} is not one of {VIDEO_CODECS}")
        if self.crf < 0 or self.gop < 1 or not (self.data_file_mb > 0 and self.video_file_mb > 0):
            raise LeRobotExportError("crf must be >= 0, gop >= 1 and the file sizes > 0")
        if not 0 <= self.svt_preset <= 13:
            raise LeRobotExportError(f"svt_preset must be within 0..13, got {self.svt_preset}")


@dataclass(frozen=True)
class ExportSummary:
    episodes: int
    frames: int
    tasks: int
    cameras: tuple[str, ...]
    video: bool
    root: Path


class _Series:
    """Numbered files (chunk-XXX/file-YYY) of one kind; the current one is closed past a size."""

    def __init__(self, root: Path, template: str, limit_mb: float, **fmt: str) -> None:
        self.root, self.template, self.limit, self.fmt = root, template, int(limit_mb * 2**20), fmt
        self.number = 0

    def path(self) -> Path:
        return self.root / self.template.format(**self.fmt, **F.chunk_file(self.number))

    def location(self) -> dict[str, int]:
        return F.chunk_file(self.number)


class _ParquetSeries(_Series):
    def __init__(self, root: Path, limit_mb: float) -> None:
        super().__init__(root, F.DATA_PATH, limit_mb)
        _, self.pa, self.pq, _ = F.require_optional()
        self.writer = None
        self.pending: list = []
        self.pending_bytes = self.file_bytes = 0

    def append(self, table) -> dict[str, int]:
        """Add one episode's frames; returns the file they are in."""
        where = self.location()
        self.pending.append(table)
        self.pending_bytes += table.nbytes
        self.file_bytes += table.nbytes
        if self.pending_bytes >= ROW_GROUP_BYTES:
            self._flush()
        if self.file_bytes >= self.limit:
            self.close()
            self.number += 1
        return {F.DATA_CHUNK: where["chunk_index"], F.DATA_FILE: where["file_index"]}

    def _flush(self) -> None:
        if not self.pending:
            return
        table = self.pa.concat_tables(self.pending)
        if self.writer is None:
            self.path().parent.mkdir(parents=True, exist_ok=True)
            self.writer = self.pq.ParquetWriter(self.path(), table.schema, compression="snappy")
        self.writer.write_table(table)
        self.pending, self.pending_bytes = [], 0

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()
            self.writer, self.file_bytes = None, 0


class _VideoSeries(_Series):
    """One camera's mp4 files: episodes back to back, frame k of a file at k / fps."""

    def __init__(self, root: Path, key: str, options: LeRobotWriterOptions) -> None:
        super().__init__(root, F.VIDEO_PATH, options.video_file_mb, video_key=key)
        self.key, self.options = key, options
        self.av = F.require_optional()[0]
        self.container = self.stream = None
        self.frames_in_file = 0
        self.to_yuv = self.av.video.reformatter.VideoReformatter()  # one converter for every frame (5x faster)

    def _open(self, height: int, width: int) -> None:
        opts = self.options
        codec_options = {"g": str(opts.gop), "crf": str(opts.crf)}
        if opts.vcodec == "libsvtav1":
            codec_options["preset"] = str(opts.svt_preset)
            os.environ.setdefault("SVT_LOG", "2")  # the encoder prints its banner to stderr unless told
        self.path().parent.mkdir(parents=True, exist_ok=True)
        try:
            self.container = self.av.open(str(self.path()), "w")
            self.stream = self.container.add_stream(opts.vcodec, rate=opts.fps, options=codec_options)
            self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, "yuv420p"
            self.stream.time_base = Fraction(1, opts.fps)
        except (self.av.FFmpegError, ValueError) as exc:
            raise LeRobotExportError(
                f"cannot open a {opts.vcodec} encoder for {width}x{height} images ({exc}); "
                "try --vcodec h264, or --no-video to store PNG images") from exc
        self.frames_in_file = self.file_bytes = 0

    def append(self, frames: np.ndarray) -> dict[str, float | int]:
        """Encode one episode's frames (T, H, W, 3) uint8; returns where they are."""
        if self.container is None:
            self._open(frames.shape[1], frames.shape[2])
        start, where = self.frames_in_file, self.location()
        for image in frames:
            frame = self.av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            frame = self.to_yuv.reformat(frame, format="yuv420p")
            frame.pts, frame.time_base = self.frames_in_file, Fraction(1, self.options.fps)
            packets = self.stream.encode(frame)
            self.container.mux(packets)
            self.file_bytes += sum(p.size for p in packets)  # the file on disk lags behind its write buffer
            self.frames_in_file += 1
        prefix = f"videos/{self.key}/"
        span = {prefix + "chunk_index": where["chunk_index"], prefix + "file_index": where["file_index"],
                prefix + "from_timestamp": start / self.options.fps,
                prefix + "to_timestamp": self.frames_in_file / self.options.fps}
        if self.file_bytes >= self.limit:
            self.close()
            self.number += 1
        return span

    def close(self) -> None:
        if self.container is not None:
            self.container.mux(self.stream.encode())  # flush the encoder
            self.container.close()
            self.container = self.stream = None

    def info(self) -> dict:
        """LeRobot's `info` block of a video feature, read back from the first file."""
        path = self.root / self.template.format(**self.fmt, **F.chunk_file(0))
        with self.av.open(str(path)) as container:
            stream = container.streams.video[0]
            return {"video.height": stream.height, "video.width": stream.width,
                    "video.codec": stream.codec_context.codec.canonical_name, "video.pix_fmt": stream.pix_fmt,
                    "video.is_depth_map": False, "video.fps": int(stream.base_rate), "video.channels": 3,
                    "has_audio": False}


def _lerobot_dtype(dtype: np.dtype) -> str:
    return "bool" if dtype == np.bool_ else np.dtype(dtype).name


def _indexed_table(pa, texts: Iterable[str], index_name: str, column: str):
    """A two-column table that pandas reads back indexed by `index_name` (how LeRobot keeps its tasks)."""
    texts = list(texts)
    table = pa.table({column: pa.array(range(len(texts)), pa.int64()), index_name: pa.array(texts, pa.string())})
    pandas_meta = {
        "index_columns": [index_name],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": column, "field_name": column, "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            {"name": index_name, "field_name": index_name, "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


class LeRobotWriter:
    """Writes episodes into a new directory as a LeRobot v3.0 dataset; `close()` writes the metadata.

    The first episode fixes the features: every later one must have the same fields and shapes.
    """

    def __init__(self, root: str | os.PathLike, options: LeRobotWriterOptions) -> None:
        self.av, self.pa, self.pq, self.Image = F.require_optional()
        self.root, self.options = Path(root), options
        if self.root.exists() and any(self.root.iterdir()):
            raise LeRobotExportError(f"{self.root} is not empty; a dataset is written into a new directory")
        self.root.mkdir(parents=True, exist_ok=True)
        self.features: dict[str, dict] | None = None
        self._shapes: dict[str, tuple] = {}
        self.tasks: dict[str, int] = {}
        self.subtasks: dict[str, int] = {}
        self.rows: list[dict] = []
        self.frames = 0
        self._numeric: dict[str, list[np.ndarray]] = {}
        self._hists: dict[str, lerobot_stats.ImageHistogram] = {}
        self._data = _ParquetSeries(self.root, options.data_file_mb)
        self._videos: dict[str, _VideoSeries] = {}

    # -- per episode ----------------------------------------------------------------
    def write(self, episode: Episode) -> None:
        steps, meta, T = episode.steps, episode.meta, episode.length
        self._check_fields(episode)
        index = len(self.rows)
        texts = meta.subtask_texts or [meta.instruction]
        lookup = np.array([self.subtasks.setdefault(t, len(self.subtasks)) for t in texts], dtype=np.int64)
        columns: dict[str, np.ndarray] = {}
        row: dict = {F.EPISODE_INDEX: index, F.TASKS: [meta.instruction], F.LENGTH: T}
        for key in self._shapes:
            feature, value = F.feature_key(key), np.asarray(steps[key])
            if key.startswith(S.IMAGE_PREFIX):
                self._hists.setdefault(feature, lerobot_stats.ImageHistogram())
                row.setdefault("_hists", {})[feature] = lerobot_stats.image_histogram(value)
                if self.options.video:
                    row.update(self._videos[feature].append(value))
                    continue
            columns[feature] = value
        columns[F.TIMESTAMP] = (np.arange(T) / self.options.fps).astype(np.float32)
        columns[F.FRAME_INDEX] = np.arange(T, dtype=np.int64)
        columns[F.EPISODE_INDEX] = np.full(T, index, dtype=np.int64)
        columns[F.INDEX] = np.arange(self.frames, self.frames + T, dtype=np.int64)
        columns[F.TASK_INDEX] = np.full(T, self.tasks.setdefault(meta.instruction, len(self.tasks)), dtype=np.int64)
        columns[F.SUBTASK_INDEX] = lookup[np.clip(steps[S.SUBTASK_ID], 0, len(texts) - 1)]
        row.update(self._data.append(self._table(columns)))
        row.update({F.FROM_INDEX: self.frames, F.TO_INDEX: self.frames + T})
        row.update({name: getattr(meta, name) for name in F.EPISODE_EXTRAS})
        row["_checksums"] = column_checksums(columns)  # PNG images included, as pixels
        row["_stats"] = {k: lerobot_stats.vector_stats(v) for k, v in columns.items()
                         if self.features[k]["dtype"] != "image"}
        for feature, hist in row.pop("_hists", {}).items():
            self._hists[feature].merge(hist)
            row["_stats"][feature] = hist.stats()
        for feature, value in columns.items():
            if self.features[feature]["dtype"] != "image":
                self._numeric.setdefault(feature, []).append(value)
        self.rows.append(row)
        self.frames += T

    def _check_fields(self, episode: Episode) -> None:
        shapes = {k: tuple(np.shape(v)[1:]) for k, v in episode.steps.items()}
        if self.features is None:
            missing = sorted({S.STATE, S.ACTION, S.SUBTASK_ID} - set(shapes))
            if missing:
                raise LeRobotExportError(f"episode {episode.meta.episode_id!r} lacks {missing}; nothing to export")
            order = [S.STATE, S.ACTION, *sorted(k for k in shapes if k.startswith(S.IMAGE_PREFIX)),
                     *[k for k in F.STEP_EXTRAS if k in shapes], *([S.TIMESTAMP] if S.TIMESTAMP in shapes else [])]
            self._shapes = {k: shapes[k] for k in order}
            self.features = self._make_features(episode)
            return
        if {k: shapes.get(k) for k in self._shapes} != self._shapes:
            got = {k: shapes.get(k) for k in self._shapes}
            raise LeRobotExportError(
                f"episode {episode.meta.episode_id!r} has fields/shapes {got}, the first episode had {self._shapes}; "
                "a LeRobot dataset has one set of features (export such episodes to separate datasets)")

    def _make_features(self, episode: Episode) -> dict[str, dict]:
        features: dict[str, dict] = {}
        for key, shape in self._shapes.items():
            feature = F.feature_key(key)
            if key.startswith(S.IMAGE_PREFIX):
                h, w, _ = shape
                if self.options.video and (h % 2 or w % 2):
                    raise LeRobotExportError(f"{key} is {h}x{w}; yuv420p video needs even sizes: use --no-video")
                features[feature] = {"dtype": "video" if self.options.video else "image", "shape": list(shape),
                                     "names": list(F.IMAGE_NAMES)}
                if self.options.video:
                    self._videos[feature] = _VideoSeries(self.root, feature, self.options)
                continue
            names = self.options.names.get(feature)
            if names is not None and (len(shape) != 1 or len(names) != shape[0]):
                raise LeRobotExportError(f"{len(names)} names given for {feature} of shape {shape}")
            features[feature] = {"dtype": _lerobot_dtype(episode.steps[key].dtype), "shape": list(shape or (1,)),
                                 "names": list(names) if names is not None else None}
        for name, dtype in [(F.TIMESTAMP, "float32"), (F.FRAME_INDEX, "int64"), (F.EPISODE_INDEX, "int64"),
                            (F.INDEX, "int64"), (F.TASK_INDEX, "int64"), (F.SUBTASK_INDEX, "int64")]:
            features[name] = {"dtype": dtype, "shape": [1], "names": None}
        return features

    def _table(self, columns: Mapping[str, np.ndarray]):
        pa = self.pa
        arrays = {}
        for name, value in columns.items():
            if self.features[name]["dtype"] == "image":
                arrays[name] = pa.StructArray.from_arrays(
                    [pa.array([self._png(im) for im in value], pa.binary()), pa.nulls(len(value), pa.string())],
                    names=["bytes", "path"])
            elif value.ndim == 2:
                arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1)), value.shape[1])
            else:
                arrays[name] = pa.array(value)
        return pa.table(arrays)

    def _png(self, image: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        self.Image.fromarray(image).save(buffer, format="png", compress_level=1)
        return buffer.getvalue()

    # -- metadata -------------------------------------------------------------------
    def close(self) -> ExportSummary:
        """Finish the files and write meta/ (episodes, tasks, subtasks, stats, info)."""
        self._data.close()
        for series in self._videos.values():
            series.close()
        if not self.rows:
            raise LeRobotExportError("no episodes were written; a LeRobot dataset needs at least one")
        for feature, series in self._videos.items():
            self.features[feature]["info"] = series.info()
        self._write_episodes()
        pq = self.pq
        pq.write_table(_indexed_table(self.pa, self.tasks, "task", F.TASK_INDEX), self.root / F.TASKS_PATH)
        pq.write_table(_indexed_table(self.pa, self.subtasks, "subtask", F.SUBTASK_INDEX), self.root / F.SUBTASKS_PATH)
        stats = {k: lerobot_stats.vector_stats(np.concatenate(v)) for k, v in self._numeric.items()}
        stats.update({k: h.stats() for k, h in self._hists.items()})
        _write_json(self.root / F.STATS_PATH, {k: lerobot_stats.to_lists(v) for k, v in stats.items() if v is not None})
        _write_json(self.root / F.INFO_PATH, self.info())
        write_checksums(self.root, [row["_checksums"] for row in self.rows])  # last: of every file above
        cameras = tuple(k[len(S.IMAGE_PREFIX):] for k in self._shapes if k.startswith(S.IMAGE_PREFIX))
        return ExportSummary(len(self.rows), self.frames, len(self.tasks), cameras, self.options.video, self.root)

    def abort(self) -> None:
        """Close open files after a failure (the directory is left for the caller to remove)."""
        for closer in [self._data.close, *(series.close for series in self._videos.values())]:
            try:
                closer()
            except Exception:  # noqa: BLE001 - already failing; the partial files are discarded
                pass

    def info(self) -> dict:
        opts, n = self.options, len(self.rows)
        return {
            "codebase_version": F.CODEBASE_VERSION, "robot_type": opts.robot_type, "total_episodes": n,
            "total_frames": self.frames, "total_tasks": len(self.tasks), "chunks_size": F.CHUNKS_SIZE,
            "data_files_size_in_mb": opts.data_file_mb, "video_files_size_in_mb": opts.video_file_mb,
            "fps": opts.fps, "splits": {"train": f"0:{n}"}, "data_path": F.DATA_PATH,
            "video_path": F.VIDEO_PATH if self._videos else None, "features": self.features,
            INFO_KEY: CHECKSUMS_PATH,
        }

    def _write_episodes(self) -> None:
        stat_columns = [(feature, stat) for feature in self.features for stat in lerobot_stats.STAT_KEYS]
        for first in range(0, len(self.rows), F.EPISODES_PER_META_FILE):
            where = F.chunk_file(first // F.EPISODES_PER_META_FILE)
            table_rows = []
            for row in self.rows[first:first + F.EPISODES_PER_META_FILE]:
                out = {k: v for k, v in row.items() if k not in ("_stats", "_checksums")}
                out[F.META_CHUNK], out[F.META_FILE] = where["chunk_index"], where["file_index"]
                for feature, stat in stat_columns:
                    value = row["_stats"].get(feature)
                    out[f"{F.STATS_PREFIX}{feature}/{stat}"] = None if value is None else np.asarray(value[stat]).tolist()
                table_rows.append(out)
            path = self.root / F.EPISODES_PATH.format(**where)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.pq.write_table(self.pa.Table.from_pylist(table_rows), path)


def open_store(path: str | os.PathLike) -> EpisodeReader:
    """The project's episode store at `path` (a zarr store or a sharded store root) for export, or a
    `LeRobotExportError` saying why it cannot be read."""
    try:
        reader = open_episode_reader(path)
    except StoreDamageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to open is reported the same way
        raise LeRobotExportError(
            f"cannot read {path} as an episode store ({type(exc).__name__}: {exc}); export reads the zarr "
            "stores that collect_demos, sim_rollout and real_recap write (sharded ones too)") from exc
    missing = sorted({S.STATE, S.ACTION} - set(reader.keys))
    if not len(reader) or missing:
        why = "holds no complete episode" if not len(reader) else f"has no {missing} arrays"
        raise LeRobotExportError(f"{path} {why}; nothing to export")
    return reader


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4, allow_nan=False) + "\n")


def export_lerobot(episodes: Iterable[Episode], out: str | os.PathLike, options: LeRobotWriterOptions, *,
                   overwrite: bool = False, on_episode: Callable[[Episode], None] | None = None) -> ExportSummary:
    """Write `episodes` as a LeRobot v3.0 dataset at `out`, all or nothing.

    The dataset is built in `.<name>.partial` beside `out` (a leftover from a crashed run is removed
    first) and renamed into place when complete. An existing non-empty `out` is refused unless
    `overwrite`, in which case it is replaced only once the new dataset is complete.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise LeRobotExportError(f"{out} already exists; choose another output directory or pass --overwrite")
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    writer = LeRobotWriter(partial, options)
    try:
        for episode in episodes:
            writer.write(episode)
            if on_episode is not None:
                on_episode(episode)
        summary = writer.close()
    except BaseException:
        writer.abort()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(partial, out)
        shutil.rmtree(old)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, out)
    return ExportSummary(summary.episodes, summary.frames, summary.tasks, summary.cameras, summary.video, out)
