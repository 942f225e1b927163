"""`.npz` episodes: one file per episode, written atomically, read without pickle, and the directory's list of
them.

An npz file is a zip archive, which keeps a CRC-32 of every array it holds: reading checks it, and
an array that is missing, cannot be decompressed or differs raises `StoreDamageError`.

The directory carries what it holds: after renaming an episode's file into place the recorder appends one line
to `episodes.jsonl` (the episode id, the file, its size and CRC-32C) with a single `O_APPEND` write, so a deleted
or replaced episode file is named by `store_check`. Each file says it is listed (`meta.listed_in`), so the list
removed is damage too. A recorder killed between the rename and the append leaves a file its next recorder
lists; an unterminated last line (killed mid-append) is ignored and cut. Directories written before the list
existed read as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tokenize
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capsule_rollout.stores import checksums as C
from capsule_rollout.stores import episode_schema as S
from capsule_rollout.stores.episode import Episode, EpisodeError, EpisodeMeta, validate_episode
from capsule_rollout.stores.store_damage import StoreDamageError

META_PREFIX = "meta."
INDEX_FILE = "episodes.jsonl"  # the directory's list of its episode files
LISTED_IN = META_PREFIX + "listed_in"  # in an episode file: the list that names it (the directory keeps one)
_LISTED = LISTED_IN + ".npy"  # its member in the zip


class NpzRecorder:
    """Writes `<directory>/<episode_id>.npz` (temp name, then rename: never half-written)."""

    def __init__(self, directory: str | os.PathLike, *, compress: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.compress = compress
        self._list_unlisted()

    def path_for(self, episode_id: str) -> Path:
        if "/" in episode_id or episode_id.startswith("."):
            raise EpisodeError(f"episode_id {episode_id!r} cannot be a file name (no '/' or leading '.')")
        return self.directory / f"{episode_id}.npz"

    def write(self, episode: Episode) -> Path:
        episode = validate_episode(episode)
        path = self.path_for(episode.meta.episode_id)
        if path.exists():
            raise EpisodeError(f"episode {episode.meta.episode_id!r} is already recorded at {path}")
        arrays = dict(episode.steps)
        for name, dtype in S.EPISODE_FIELDS.items():
            arrays[META_PREFIX + name] = np.asarray(getattr(episode.meta, name), dtype=dtype)
        arrays[LISTED_IN] = np.asarray(INDEX_FILE)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
        try:
            (np.savez_compressed if self.compress else np.savez)(tmp, **arrays)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self._list(episode.meta.episode_id, path)
        return path

    def episode_paths(self) -> list[Path]:
        return sorted(p for p in self.directory.glob("*.npz") if not p.name.startswith("."))

    def _list(self, episode_id: str, path: Path) -> None:
        crc, size = C.file_checksum(path)
        line = json.dumps({"episode_id": episode_id, "file": path.name, "bytes": size, C.ALGORITHM: crc}) + "\n"
        fd = os.open(self.directory / INDEX_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def _list_unlisted(self) -> None:
        """Cut an unterminated last line of the list, and list the files a killed recorder renamed into place but
        did not list (only files that say they are listed: older ones stay as they are); refuse a directory whose
        list was removed."""
        index = self.directory / INDEX_FILE
        if index.is_file():
            raw = index.read_bytes()
            if not raw.endswith(b"\n"):
                os.truncate(index, raw.rfind(b"\n") + 1)
        listed = read_index(self.directory)
        unlisted = [p for p in self.episode_paths() if (listed is None or p.name not in listed.entries)
                    and says_listed(p)]
        if listed is None and unlisted:  # the list removed: listing what is left would hide a deleted file
            raise StoreDamageError(self.directory, "every episode", {INDEX_FILE: (
                f"is missing, and {len(unlisted)} episode files say it lists them: restore it from a copy, or record "
                "to another directory")})
        for path in unlisted:
            self._list(path.stem, path)


@dataclass(frozen=True)
class NpzIndex:
    """A directory's list of episode files: file name -> its line (`episode_id`, `file`, `bytes`, `crc32c`)."""

    entries: dict[str, dict]
    problems: dict[str, str]  # lines that are not entries, by line number

    def check(self, path: Path) -> str | None:
        """Why listed file `path` differs from what was listed (None: it does not)."""
        want = self.entries[path.name]
        if not path.is_file():
            return f"the file is missing ({INDEX_FILE} lists it)"
        crc, size = C.file_checksum(path)
        if (crc, size) != (want[C.ALGORITHM], want["bytes"]):
            return f"checksum mismatch ({size} bytes; {want['bytes']} were written, {INDEX_FILE})"
        return None


def read_index(directory: str | os.PathLike) -> NpzIndex | None:
    """The list of an npz directory (None: it has none); a later line for a file replaces an earlier one."""
    path = Path(directory) / INDEX_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    entries, problems = {}, {}
    for number, line in enumerate(raw[: raw.rfind(b"\n") + 1].splitlines(), start=1):
        try:
            entry = json.loads(line)
            if not (isinstance(entry.get("file"), str) and isinstance(entry.get("episode_id"), str)
                    and isinstance(entry.get("bytes"), int) and isinstance(entry.get(C.ALGORITHM), int)):
                raise ValueError("not an entry (episode_id, file, bytes, crc32c)")
        except (ValueError, AttributeError) as exc:
            problems[f"{INDEX_FILE} line {number}"] = f"cannot be read ({exc}): {line[:120]!r}"
            continue
        entries[entry["file"]] = entry
    return NpzIndex(entries, problems)


def says_listed(path: str | os.PathLike) -> bool:
    """Whether an episode file says its directory lists it (written by a recorder that keeps the list)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return _LISTED in archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


# what zipfile, zlib and numpy's header parser raise for a damaged file (a missing one stays FileNotFoundError)
_DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, TypeError, SyntaxError, NotImplementedError,
           tokenize.TokenError, OSError)
_REQUIRED = [f.name for f in dataclasses.fields(EpisodeMeta) if f.default is dataclasses.MISSING]


def read_npz_episode(path: str | os.PathLike) -> Episode:
    """Load an episode written by `NpzRecorder` (`allow_pickle=False`); a damaged file raises `StoreDamageError`."""
    path = Path(path)
    label = f"episode {path.stem!r}"
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except _DAMAGE as exc:
        raise StoreDamageError(path, label, {path.name: f"cannot be opened ({type(exc).__name__}: {exc})"}) from exc
    with data:
        values = {}
        for key in data.files:
            try:
                values[key] = data[key]
            except _DAMAGE as exc:
                raise StoreDamageError(path, label, {key: f"cannot be read ({type(exc).__name__}: {exc})"}) from exc
    steps = {k: v for k, v in values.items() if not k.startswith(META_PREFIX)}
    fields = {}
    for name, dtype in S.EPISODE_FIELDS.items():
        if META_PREFIX + name not in values:  # written before the field existed: its default
            continue
        value = values[META_PREFIX + name][()]
        fields[name] = str(value) if dtype.kind == "U" else value.item()
    missing = [name for name in _REQUIRED if name not in fields]
    if missing:
        raise StoreDamageError(path, label, {META_PREFIX + name: "the array is missing" for name in missing})
    return Episode(steps, EpisodeMeta(**fields))
