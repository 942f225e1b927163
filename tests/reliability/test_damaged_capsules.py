"""Damaged capsule files against a live arena (a tabletop env and the stand-in policy and walker): every
variant is refused, and a refused one leaves the arena exactly as it was, live state outside it included.
Each file is also put in a capsule store's disk tier: the store opens, and a file it cannot use is set
aside, never handed out. The slow run flips ten times as many bits.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from capsule_rollout.capsules import Arena, CapsuleError, CapsuleStore, capsule_from_bytes, restore, snapshot
from capsule_rollout.capsules.capsule_file import FILE_SUFFIX
from capsule_rollout.capsules.reference_components import NoisyChunkStandIn, NumpyWalkerStandIn
from capsule_rollout.tabletop.tabletop_env import TabletopEnv
from capsule_rollout.tabletop.tasks import family_index
from tests.reliability.capsule_damage import variants


class LiveHost:
    """An env, a stochastic chunked policy and a numpy walker in one arena, with their live state."""

    def __init__(self) -> None:
        self.env = TabletopEnv("pick_place", cameras=())
        self.policy, self.walker = NoisyChunkStandIn(), NumpyWalkerStandIn()
        self.arena = Arena([self.env, self.policy, self.walker]).allocate()

    def run(self, seed: int, steps: int) -> None:
        self.env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            self.env.step(rng.uniform(-1, 1, 4).astype(np.float32))
            self.policy.act(torch.from_numpy(rng.normal(size=(2, 6)).astype(np.float32)))
            self.walker.advance(rng.normal(size=(4, 3)))

    def state(self) -> dict[str, torch.Tensor]:
        """Every slab byte and the live state outside the arena."""
        out = {f"slab{i}": slab.clone() for i, (_, slab) in enumerate(self.arena.slabs())}
        out["qpos"] = torch.from_numpy(self.env.data.qpos.copy())
        out["qvel"] = torch.from_numpy(self.env.data.qvel.copy())
        out["env_counters"] = torch.tensor([self.env.steps, self.env.subtask_index, self.env.params.family])
        out["policy_noise"] = self.policy.noise.get_state()
        out["walker_rng"] = torch.tensor(list(self.walker.rng.bit_generator.state["state"].values()), dtype=torch.float64)
        return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def host():
    host = LiveHost()
    host.run(seed=3, steps=4)
    host.capsule = snapshot(host.arena, label="boundary", step=4)
    host.run(seed=5, steps=3)  # the arena moves on: a restore would change it
    return host


def _try(host: LiveHost, data: bytes) -> str:
    """'refused' (a CapsuleError from loading or restoring), 'accepted', or the unexpected exception."""
    try:
        capsule = capsule_from_bytes(data, source="variant")
        restore(host.arena, capsule)
    except CapsuleError:
        return "refused"
    except Exception as exc:  # noqa: BLE001 - a crash is a result to report
        return f"crash: {type(exc).__name__}: {str(exc)[:200]}"
    return "accepted"


def _through_a_store(directory, data: bytes, host: LiveHost) -> str:
    """The file in a store's disk tier: the store must open; a file it indexes must not be handed out whole
    unless the restore then refuses it."""
    directory.mkdir()
    (directory / f"variant{FILE_SUFFIX}").write_bytes(data)
    try:
        store = CapsuleStore(disk_dir=directory, key=None)  # the format's checks (a signed store refuses all of these)
    except Exception as exc:  # noqa: BLE001
        return f"store did not open: {type(exc).__name__}: {exc}"
    if "k" not in store:
        return "set aside at open" if list(directory.glob("*.corrupt")) else "skipped at open"
    try:
        capsule = store.get("k")
    except CapsuleError:
        return "set aside by get" if "k" not in store and list(directory.glob("*.corrupt")) else "refused, kept"
    except Exception as exc:  # noqa: BLE001
        return f"crash in get: {type(exc).__name__}: {exc}"
    try:
        restore(host.arena, capsule)
    except CapsuleError:
        return "restore refused"
    except Exception as exc:  # noqa: BLE001
        return f"crash in restore: {type(exc).__name__}: {exc}"
    return "accepted"


def _check(host, tmp_path, flips: int, report) -> None:
    rng = np.random.default_rng(2024)
    other = family_index("stack")
    outcomes, kinds, untouched, store_outcomes = Counter(), Counter(), 0, Counter()
    failures = []
    damaged = variants(host.capsule, "env/task", other, rng, flips, annotations={"store_key": "k"})
    for i, (kind, name, data) in enumerate(damaged):
        before = host.state()
        outcome = _try(host, data)
        store_outcome = _through_a_store(tmp_path / f"v{i}", data, host) if len(data) < (1 << 20) else "too big"
        same = _same(before, host.state())
        outcomes[outcome] += 1
        kinds[kind] += 1
        store_outcomes[store_outcome.split(":")[0]] += 1
        untouched += same
        if outcome != "refused" or not same or store_outcome.startswith(("accepted", "store did not", "crash")):
            failures.append((kind, name, outcome, same, store_outcome))
    tried = sum(kinds.values())
    report.add("damaged capsules", variants_tried=tried, refused=outcomes["refused"], arena_untouched=untouched,
               store_opened=tried - store_outcomes["store did not open"])
    assert not failures, failures[:10]
    assert set(kinds) == {"truncation", "bit flip", "relabelled dtype", "relabelled shape", "overlapping offsets",
                          "NaN/Infinity in header", "huge string", "missing tensor", "wrong version",
                          "consistent shape change", "edited with digests recomputed"}
    assert store_outcomes["set aside at open"] and store_outcomes["set aside by get"] and store_outcomes["restore refused"]


def test_every_damaged_capsule_is_refused_and_the_arena_untouched(host, tmp_path, report):
    _check(host, tmp_path, flips=60, report=report)


@pytest.mark.slow
def test_many_bit_flips(host, tmp_path, report):
    _check(host, tmp_path, flips=600, report=report)


def test_the_undamaged_capsule_restores(host):
    from capsule_rollout.capsules import capsule_to_bytes

    restore(host.arena, capsule_from_bytes(capsule_to_bytes(host.capsule)))
    assert host.env.steps == 4 and host.env.params.family == family_index("pick_place")
