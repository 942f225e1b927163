"""Each env's capsules at each trust level: restored from its own signed capsule, and from the same capsule signed
by a second key and read as data (`replay --trust`), into a fresh env of the same id.

    python -m tests.reliability.trust_survey ENV... > survey.json

For each env (a registered id or a factory's import path, made by `envs.suites.make_env` with no camera): reset
with seed 0, 3 steps of seeded random actions, a snapshot saved signed with the user's key and with a second one;
each file loaded (the second one as data) and restored into a fresh env, which then steps 3 more seeded actions
beside the original. A level is `bit-exact` when every step's observation, reward and end flags, and the MuJoCo
state after them, equal the original's byte for byte (else what differs); `refused` with the refusal's message
(what the capsule needs). Prints one JSON object per env.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from capsule_rollout.capsules import Arena, CapsuleMismatchError, load_capsule, restore, save_capsule, snapshot
from capsule_rollout.envs.suites import make_env

OWN_KEY = "the-user-s-own-key-0123456789abcdef"
OTHER_KEY = "a-second-key-elsewhere-0123456789ab"
STEPS = 3


def _actions(env, n: int, seed: int) -> list:
    space = env.action_space
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def _bytes(x) -> bytes:
    if isinstance(x, dict):
        return b"".join(k.encode() + _bytes(v) for k, v in sorted(x.items()))
    return np.asarray(x).tobytes()


def _play(env, arena: Arena, actions: list) -> dict[str, bytes]:
    """What the env shows over `actions` (each step's observation, reward, end flags), then its MuJoCo state."""
    out = {}
    for i, action in enumerate(actions):
        obs, reward, terminated, truncated, _ = env.step(action)
        out[f"step {i}"] = _bytes(obs) + _bytes(reward) + _bytes([terminated, truncated])
    out.update({k: t.numpy().tobytes() for k, t in snapshot(arena).tensors().items() if "mjdata" in k or
                "physics" in k})
    return out


def survey(env_id: str, directory: Path) -> dict:
    """The outcome of each level for `env_id` (the module docstring)."""
    env = make_env(env_id, cameras=())
    arena = Arena([env]).allocate()
    env.reset(seed=0)
    for action in _actions(env, STEPS, 0):
        env.step(action)
    capsule = snapshot(arena)
    files = {"own": save_capsule(capsule, directory / "own.capsule", key=OWN_KEY),
             "data": save_capsule(capsule, directory / "other.capsule", key=OTHER_KEY)}
    later = _actions(env, STEPS, 1)
    played = _play(env, arena, later)
    out: dict = {"env": env_id, "capsule_bytes": files["own"].stat().st_size}
    for level, path in files.items():
        fresh = make_env(env_id, cameras=())
        fresh_arena = Arena([fresh]).allocate()
        loaded = load_capsule(path, key=OWN_KEY) if level == "own" else load_capsule(path, key=None)
        try:
            restore(fresh_arena, loaded)
        except CapsuleMismatchError as exc:
            out[level] = {"outcome": "refused", "why": str(exc).splitlines()[1].strip()}
            fresh.close()
            continue
        again = _play(fresh, fresh_arena, later)
        differ = sorted(k for k in played.keys() | again.keys() if played.get(k) != again.get(k))
        out[level] = {"outcome": "bit-exact" if not differ else "differs", "differs": differ}
        fresh.close()
    env.close()
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        for env_id in argv:
            try:
                row = survey(env_id, Path(d))
            except Exception as exc:  # noqa: BLE001 - an env that cannot be made here is reported, the rest go on
                row = {"env": env_id, "error": f"{type(exc).__name__}: {exc}"[:300]}
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main(sys.argv[1:]))
