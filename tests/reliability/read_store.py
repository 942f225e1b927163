"""Reads episode stores the way users outside this project do, and prints what each reader sees (JSON).

Runs with zarr 2.x or 3.x and numpy only (no project code), so the same reading can be checked with
the zarr a diffusion_policy environment has. Two readers:

- `plain`: `meta/episode_ends` gives the episodes; each is `data/<key>[start:end]`;
- `diffusion_policy`: what its `ReplayBuffer` does on opening a store: every `data/<key>` array must be
  exactly `episode_ends[-1]` rows long, else it refuses the store; then the same slicing.

Each visible episode is checked against the markers the test episodes carry (state[:, 0] = episode
index, state[:, 1] = step, `done` only at the last step, image pixel = (index + step) % 256, `length`
and `episode_id` agree): a reader sees either a list of complete episode ids or an error.

argv: STORE [STORE ...]; prints {"zarr": version, "stores": {STORE: {"plain": ..., "diffusion_policy": ...}}}.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import zarr


def _episodes(root, ends: np.ndarray) -> list[str]:
    meta, data = root["meta"], root["data"]
    if len(ends) and (ends[0] <= 0 or np.any(np.diff(ends) <= 0)):
        raise ValueError(f"episode_ends {ends.tolist()} are not increasing")
    ids = [str(x) for x in np.asarray(meta["episode_id"][: len(ends)])]
    lengths = np.asarray(meta["length"][: len(ends)])
    if len(ids) != len(ends) or len(lengths) != len(ends):
        raise ValueError(f"{len(ends)} ends but {len(ids)} ids and {len(lengths)} lengths")
    state, done, image = data["state"], data["done"], data["image_front"]
    for i, end in enumerate(ends):
        start = int(ends[i - 1]) if i else 0
        s, d, img = state[start:end], done[start:end], image[start:end]
        index, n = int(ids[i].split("-")[-1]), int(end) - start
        steps = np.arange(n)
        if len(s) != n or len(d) != n or len(img) != n or int(lengths[i]) != n:
            raise ValueError(f"episode {ids[i]}: {n} steps by its ends, {len(s)} rows, length {int(lengths[i])}")
        if not (np.all(s[:, 0] == index) and np.array_equal(s[:, 1], steps)):
            raise ValueError(f"episode {ids[i]}: its rows belong to another episode")
        if not (d[-1] and not d[:-1].any() and np.array_equal(img[:, 0, 0, 0], (index + steps) % 256)):
            raise ValueError(f"episode {ids[i]}: done flags or images do not match")
    return ids


def read_plain(path: str) -> list[str]:
    root = zarr.open(path, mode="r")
    return _episodes(root, np.asarray(root["meta"]["episode_ends"][:]))


def read_diffusion_policy(path: str) -> list[str]:
    root = zarr.open(path, mode="r")
    ends = np.asarray(root["meta"]["episode_ends"][:])
    if not len(ends):
        raise ValueError("no episodes: ReplayBuffer reads episode_ends[-1]")
    for key in root["data"]:
        if root["data"][key].shape[0] != ends[-1]:
            raise ValueError(f"data/{key} has {root['data'][key].shape[0]} rows, episode_ends[-1] is {ends[-1]}")
    return _episodes(root, ends)


def main(paths: list[str]) -> None:
    out = {}
    for path in paths:
        seen = {}
        for name, read in (("plain", read_plain), ("diffusion_policy", read_diffusion_policy)):
            try:
                seen[name] = {"ids": read(path)}
            except Exception as exc:  # noqa: BLE001 - what the reader saw is the result
                seen[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        out[path] = seen
    print(json.dumps({"zarr": zarr.__version__, "stores": out}))


if __name__ == "__main__":
    main(sys.argv[1:])
