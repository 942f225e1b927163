"""Checksums of a LeRobot v3.0 export, in a sidecar LeRobot's loader does not read: `meta/checksums.json`.

It holds the CRC-32C (`stores.checksums`) and size of every file of the dataset, and per episode the
CRC-32C of each frame column as written (the numpy values; PNG images as their pixels). Videos are
lossy, so a video is checked by its file's checksum. `LeRobotDatasetReader` checks what it reads
against them and raises `StoreDamageError`; a dataset without the sidecar (made by other tools, or
before it existed) is read unverified. `meta/info.json` names the sidecar (`INFO_KEY`; LeRobot's loader
ignores the key), so an export whose sidecar was removed is damage, not unverified: the sidecar holds
info.json's checksum, so neither can go without the other being told.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from capsule_rollout.stores import checksums as C
from capsule_rollout.stores.store_damage import StoreDamageError

CHECKSUMS_PATH = "meta/checksums.json"
INFO_KEY = "capsule_rollout_checksums"  # in meta/info.json: the sidecar's path (the export carries one)
FORMAT = "capsule_rollout.lerobot_checksums"
VERSION = 1


def column_checksums(columns: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Feature -> CRC-32C of one episode's frame column (or images)."""
    return {feature: C.checksum(np.asarray(value)) for feature, value in columns.items()}


def write_checksums(root: str | os.PathLike, episodes: list[dict[str, int]]) -> None:
    """Write the sidecar of a finished dataset at `root`: every other file's checksum, and the episodes' columns'."""
    root = Path(root)
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel != CHECKSUMS_PATH:
            crc, size = C.file_checksum(path)
            files[rel] = {C.ALGORITHM: crc, "bytes": size}
    data = {"format": FORMAT, "version": VERSION, "algorithm": C.ALGORITHM, "files": files, "episodes": episodes}
    tmp = root / f"{CHECKSUMS_PATH}.partial"
    tmp.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    os.replace(tmp, root / CHECKSUMS_PATH)


class DatasetChecksums:
    """The sidecar of a dataset, if it has one: `check_file` and `check_columns` say what differs."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        path = self.root / CHECKSUMS_PATH
        self.files: dict[str, dict] | None = None
        self.episodes: list[dict[str, int]] = []
        self._checked: dict[str, str | None] = {}
        if not path.is_file():
            if _names_sidecar(self.root / "meta" / "info.json"):
                raise StoreDamageError(self.root, "every episode", {CHECKSUMS_PATH: (
                    f"is missing: meta/info.json says the export carries it ({INFO_KEY}); its episodes cannot be "
                    "checked: export the store again, or restore the file from a copy")})
            return
        try:
            data = json.loads(path.read_text())
            files, episodes = data["files"], data["episodes"]
            ok = data.get("format") == FORMAT and data.get("algorithm") == C.ALGORITHM and isinstance(files, dict)
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreDamageError(self.root, "every episode", {CHECKSUMS_PATH: f"cannot be read ({type(exc).__name__}: "
                                   f"{exc}); the data may be whole: move the file away to read it unverified"}) from None
        if not ok:
            raise ValueError(f"{path} is not a {FORMAT} file of {C.ALGORITHM} checksums this code reads")
        self.files, self.episodes = files, episodes

    @property
    def verified(self) -> bool:
        return self.files is not None

    def check_file(self, rel: str) -> str | None:
        """Why file `rel` (relative to the dataset) differs from what was written; None when it does not (or is
        not listed). Each file is read once."""
        if self.files is None or rel not in self.files:
            return None
        if rel not in self._checked:
            path, want = self.root / rel, self.files[rel]
            if not path.is_file():
                self._checked[rel] = f"{rel} is missing"
            else:
                crc, size = C.file_checksum(path)
                self._checked[rel] = (None if (crc, size) == (want[C.ALGORITHM], want["bytes"]) else
                                      f"{rel}: checksum mismatch ({size} bytes; {want['bytes']} were written)")
        return self._checked[rel]

    def check_columns(self, episode_index: int, columns: Mapping[str, np.ndarray]) -> dict[str, str]:
        """Feature -> why, for each of the episode's columns whose values differ from what was written."""
        if self.files is None or not 0 <= episode_index < len(self.episodes):
            return {}
        want = self.episodes[episode_index]
        got = column_checksums({k: v for k, v in columns.items() if k in want})
        return {k: "checksum mismatch: the values read differ from what was written" for k, crc in got.items()
                if crc != want[k]}

    def damaged_files(self) -> dict[str, str]:
        """Every listed file that is missing or differs (reads them all)."""
        return {rel: why for rel in (self.files or {}) if (why := self.check_file(rel)) is not None}


def _names_sidecar(info: Path) -> bool:
    """Whether a dataset's info.json says it carries the sidecar (an unreadable one is found by the reader)."""
    try:
        return json.loads(info.read_text()).get(INFO_KEY) == CHECKSUMS_PATH
    except (OSError, ValueError, AttributeError):
        return False
