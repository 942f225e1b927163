"""Property-based tests over random specs and random store operation sequences."""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from capsule_rollout.capsules import (
    Arena,
    BufferSpec,
    CapsuleNotFoundError,
    CapsuleStore,
    Role,
    StoreBudgetError,
    Tier,
    capsule_from_bytes,
    capsule_to_bytes,
    fork,
    restore,
    snapshot,
)
from capsule_rollout.capsules.buffer_spec import DTYPES
from tests.capsules.fakes import SpecComponent, fill_state, same_bytes, state_copy
from tests.conftest import DEVICES

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


@st.composite
def spec_lists(draw) -> list[BufferSpec]:
    n = draw(st.integers(1, 6))
    names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=n, max_size=n, unique=True))
    specs = []
    for name in names:
        specs.append(
            BufferSpec(
                name,
                draw(shapes),
                draw(st.sampled_from(sorted(DTYPES.values(), key=str))),
                draw(st.sampled_from(DEVICES)),
                draw(st.sampled_from([Role.STATE, Role.STATE, Role.IO, Role.SCRATCH])),
            )
        )
    return specs


def _arena(specs_a, specs_b=None) -> Arena:
    comps = [SpecComponent("a", specs_a)]
    if specs_b is not None:
        comps.append(SpecComponent("b", specs_b))
    return Arena(comps).allocate()


@given(spec_lists(), st.one_of(st.none(), spec_lists()), st.integers(0, 2**16))
def test_round_trip_is_the_identity(specs_a, specs_b, seed):
    arena = _arena(specs_a, specs_b)
    fill_state(arena, seed)
    expected = state_copy(arena)
    capsule = snapshot(arena, step=seed)
    arena.fill_random_(torch.Generator().manual_seed(seed + 1))
    restore(arena, capsule)
    for k, v in expected.items():
        assert same_bytes(arena.buffer(k), v), k
    again = capsule_from_bytes(capsule_to_bytes(capsule))
    arena.fill_random_(torch.Generator().manual_seed(seed + 2))
    restore(arena, again.to_devices())
    for k, v in expected.items():
        assert same_bytes(arena.buffer(k), v), k
    assert dict(again.digests) == dict(capsule.digests)


def _ranges(arena: Arena) -> list[tuple[int, int]]:
    return [(s.data_ptr(), s.data_ptr() + s.numel()) for _, s in arena.slabs() if s.numel()]


@given(spec_lists(), st.integers(0, 2**16))
def test_fork_branches_never_alias(specs, seed):
    a, b = _arena(specs), _arena(specs)
    fill_state(a, seed)
    capsule = snapshot(a)
    digests = dict(capsule.digests)
    fork(capsule, [a, b])
    cap_ranges = [(s.data_ptr(), s.data_ptr() + s.numel()) for _, s in capsule.slabs() if s.numel()]
    spans = _ranges(a) + _ranges(b) + cap_ranges
    for i, (s1, e1) in enumerate(spans):
        for s2, e2 in spans[i + 1 :]:
            assert e1 <= s2 or e2 <= s1, "two live copies share memory"
    before_b = state_copy(b)
    a.fill_random_(torch.Generator().manual_seed(seed + 7))
    for k, v in before_b.items():
        assert same_bytes(b.buffer(k), v)
    assert capsule.compute_digests() == digests


class StoreModel(RuleBasedStateMachine):
    """The store against a list-based reference model of its tiers (equal-size capsules)."""

    KEYS = ["a", "b", "c", "d", "e", "f"]

    @initialize(device_slots=st.integers(0, 3), host_slots=st.integers(0, 2), with_disk=st.booleans())
    def setup(self, device_slots, host_slots, with_disk):
        self.arena = _arena([BufferSpec("x", (3,), torch.float32), BufferSpec("m", (2,), torch.bool)])
        self.size = snapshot(self.arena).nbytes
        self.slots = {Tier.DEVICE: device_slots, Tier.HOST: host_slots, Tier.DISK: None}
        self.tmp = tempfile.TemporaryDirectory() if with_disk else None
        self.store = CapsuleStore(
            device_bytes=device_slots * self.size,
            host_bytes=host_slots * self.size,
            disk_dir=self.tmp.name if self.tmp else None,
        )
        self.tiers = {t: [] for t in Tier}  # least recently used first; DISK: capsules only on disk
        self.files: list[str] = []  # keys with a disk file (kept after loading too), least recently used first
        self.pinned: set[str] = set()
        self.digests: dict[str, dict] = {}
        self.counter = 0

    def teardown(self):
        if getattr(self, "tmp", None):
            self.tmp.cleanup()

    def _where(self, key):
        return next((t for t in Tier if key in self.tiers[t]), None)

    def _enforce(self):
        for tier, nxt in ((Tier.DEVICE, Tier.HOST), (Tier.HOST, Tier.DISK), (Tier.DISK, None)):
            cap = self.slots[tier]
            while cap is not None and len(self.tiers[tier]) > cap:
                victim = next((k for k in self.tiers[tier] if k not in self.pinned), None)
                if victim is None:
                    break
                self.tiers[tier].remove(victim)
                if nxt is Tier.DISK and self.tmp is None:
                    nxt = None
                if nxt is None:
                    self.digests.pop(victim)
                else:
                    self.tiers[nxt].append(victim)
                    if nxt is Tier.DISK:  # a file kept from an earlier load is reused
                        self._touch_file(victim)

    def _touch_file(self, key):
        if key in self.files:
            self.files.remove(key)
        self.files.append(key)

    def _to_device(self, key):
        if self._where(key) is Tier.DISK:
            self._touch_file(key)  # loaded: the file stays
        self.tiers[self._where(key)].remove(key)
        self.tiers[Tier.DEVICE].append(key)

    @rule(key=st.sampled_from(KEYS), pin=st.booleans())
    def put(self, key, pin):
        self.counter += 1
        fill_state(self.arena, self.counter)
        capsule = snapshot(self.arena, step=self.counter)
        others = len(self.pinned - {key})
        if pin and others + 1 > self.slots[Tier.DEVICE]:
            with pytest.raises(StoreBudgetError):
                self.store.put(key, capsule, pin=True)
            return
        self.store.put(key, capsule, pin=pin)
        if self._where(key) is not None:
            self.tiers[self._where(key)].remove(key)
        if key in self.files:  # the replaced capsule's file is deleted
            self.files.remove(key)
        self.tiers[Tier.DEVICE].append(key)
        self.pinned.discard(key)
        if pin:
            self.pinned.add(key)
        self.digests[key] = dict(capsule.digests)
        self._enforce()

    @rule(key=st.sampled_from(KEYS))
    def get(self, key):
        if key not in self.digests:
            with pytest.raises(CapsuleNotFoundError):
                self.store.get(key)
            return
        got = self.store.get(key)
        assert dict(got.digests) == self.digests[key] == got.compute_digests()
        self._to_device(key)
        self._enforce()

    @precondition(lambda self: self.digests)
    @rule(data=st.data())
    def pin(self, data):
        key = data.draw(st.sampled_from(sorted(self.digests)))
        if key in self.pinned:
            self.store.pin(key)
            return
        if len(self.pinned) + 1 > self.slots[Tier.DEVICE]:
            with pytest.raises(StoreBudgetError):
                self.store.pin(key)
            return
        self.store.pin(key)
        if self._where(key) is not Tier.DEVICE:
            self._to_device(key)
        self.pinned.add(key)
        self._enforce()

    @precondition(lambda self: self.pinned)
    @rule(data=st.data())
    def unpin(self, data):
        key = data.draw(st.sampled_from(sorted(self.pinned)))
        self.store.unpin(key)
        self.pinned.discard(key)
        self._enforce()

    @invariant()
    def tiers_match_the_model(self):
        if not hasattr(self, "store"):
            return
        for tier in (Tier.DEVICE, Tier.HOST):
            assert self.store.lru_order(tier) == self.tiers[tier], tier
        assert self.store.lru_order(Tier.DISK) == self.files
        assert [k for k in self.store.keys() if self.store.tier_of(k) is Tier.DISK] == [
            k for k in self.store.keys() if k in self.tiers[Tier.DISK]]
        assert all(self.store.tier_of(k) is Tier.DEVICE for k in self.pinned)
        stats = self.store.stats()
        assert stats.bytes["device"] == len(self.tiers[Tier.DEVICE]) * self.size
        assert stats.bytes["host"] == len(self.tiers[Tier.HOST]) * self.size
        assert stats.pinned == len(self.pinned)
        on_disk = sorted(Path(self.tmp.name).glob("*.capsule")) if self.tmp else []
        assert len(on_disk) == len(self.files) and stats.bytes["disk"] == sum(p.stat().st_size for p in on_disk)


StoreModel.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
test_store_eviction_respects_pins_and_lru = StoreModel.TestCase
