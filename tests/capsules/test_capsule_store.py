import pytest

from capsule_rollout.capsules import (
    CapsuleFormatError,
    CapsuleIntegrityError,
    CapsuleNotFoundError,
    CapsuleStore,
    StoreBudgetError,
    Tier,
    restore,
    snapshot,
)
from tests.capsules.fakes import fill_state, make_arena, same_bytes


@pytest.fixture
def arena():
    arena, _ = make_arena()
    return arena


def _capsules(arena, n):
    out = []
    for i in range(n):
        fill_state(arena, i)
        out.append(snapshot(arena, label=f"c{i}", step=i))
    return out


def test_put_get_hit_and_miss_with_suggestion(arena):
    store = CapsuleStore()
    (cap,) = _capsules(arena, 1)
    store.put("seed-17", cap)
    assert store.get("seed-17") is cap
    with pytest.raises(CapsuleNotFoundError, match="did you mean 'seed-17'"):
        store.get("seed-71")
    stats = store.stats()
    assert stats.hits["device"] == 1 and stats.misses == 1
    assert stats.bytes["device"] == cap.nbytes and stats.entries["device"] == 1


def test_lru_demotes_device_to_host_to_disk(arena, tmp_path):
    caps = _capsules(arena, 4)
    size = caps[0].nbytes
    store = CapsuleStore(device_bytes=2 * size, host_bytes=1 * size, disk_dir=tmp_path)
    for i, cap in enumerate(caps[:3]):
        store.put(f"k{i}", cap)
    assert store.lru_order(Tier.DEVICE) == ["k1", "k2"] and store.tier_of("k0") is Tier.HOST
    store.get("k1")  # k1 becomes most recent: k2 is now the device LRU
    store.put("k3", caps[3])
    assert store.lru_order(Tier.DEVICE) == ["k1", "k3"]
    assert store.tier_of("k2") is Tier.HOST and store.tier_of("k0") is Tier.DISK
    assert len(list(tmp_path.glob("*.capsule"))) == 1
    stats = store.stats()
    assert stats.evictions["device"] == 2 and stats.evictions["host"] == 1


def test_rehydration_from_host_and_disk_is_bit_exact(arena, tmp_path):
    caps = _capsules(arena, 3)
    size = caps[0].nbytes
    store = CapsuleStore(device_bytes=size, host_bytes=size, disk_dir=tmp_path)
    for i, cap in enumerate(caps):
        store.put(f"k{i}", cap)
    assert [store.tier_of(f"k{i}") for i in range(3)] == [Tier.DISK, Tier.HOST, Tier.DEVICE]
    for i in (1, 0):  # host hit first: promoting k0 later pushes k1 back down
        got = store.get(f"k{i}")
        assert store.tier_of(f"k{i}") is Tier.DEVICE
        restore(arena, got)
        for k in caps[i].specs:
            assert same_bytes(arena.buffer(k), caps[i].buffer(k))
    stats = store.stats()
    assert stats.hits["disk"] == 1 and stats.hits["host"] == 1 and stats.rehydrations == 2


def test_pinned_capsules_are_never_demoted(arena):
    caps = _capsules(arena, 4)
    size = caps[0].nbytes
    store = CapsuleStore(device_bytes=2 * size, host_bytes=size)
    store.put("eval-0", caps[0], pin=True)
    for i in range(1, 4):
        store.put(f"k{i}", caps[i])
    assert store.tier_of("eval-0") is Tier.DEVICE and store.is_pinned("eval-0")
    assert store.lru_order(Tier.DEVICE) == ["eval-0", "k3"]
    assert store.lru_order(Tier.HOST) == ["k2"]
    assert store.stats().dropped == 1  # no disk tier: the host LRU (k1) was forgotten


def test_pin_beyond_device_budget_is_refused(arena):
    caps = _capsules(arena, 3)
    size = caps[0].nbytes
    store = CapsuleStore(device_bytes=2 * size)
    store.put("a", caps[0], pin=True)
    store.put("b", caps[1], pin=True)
    with pytest.raises(StoreBudgetError, match="raise device_bytes or unpin"):
        store.put("c", caps[2], pin=True)
    assert "c" not in store
    store.unpin("a")
    store.put("c", caps[2], pin=True)
    assert store.tier_of("a") is Tier.HOST


def test_pin_promotes_from_lower_tiers(arena, tmp_path):
    caps = _capsules(arena, 3)
    size = caps[0].nbytes
    store = CapsuleStore(device_bytes=size, host_bytes=0, disk_dir=tmp_path)
    for i, cap in enumerate(caps):
        store.put(f"k{i}", cap)
    assert store.tier_of("k0") is Tier.DISK
    store.pin("k0")
    assert store.tier_of("k0") is Tier.DEVICE and store.tier_of("k2") is Tier.DISK


def test_store_reopens_its_disk_tier(arena, tmp_path):
    caps = _capsules(arena, 2)
    first = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path)
    first.put("alpha", caps[0])
    first.put("beta", caps[1])
    again = CapsuleStore(disk_dir=tmp_path)
    assert sorted(again.keys()) == ["alpha", "beta"]
    got = again.get("beta")
    assert dict(got.digests) == dict(caps[1].digests)


def test_corrupt_disk_file_is_refused_and_set_aside(arena, tmp_path):
    (cap,) = _capsules(arena, 1)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path)
    store.put("k", cap)
    (path,) = tmp_path.glob("*.capsule")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CapsuleIntegrityError):
        store.get("k")
    assert "k" not in store
    assert len(list(tmp_path.glob("*.corrupt"))) == 1


def test_disk_budget_drops_least_recent_files(arena, tmp_path):
    caps = _capsules(arena, 3)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path)
    store.put("k0", caps[0])
    file_size = store.stats().bytes["disk"]
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path, disk_bytes=2 * file_size)
    store.put("k1", caps[1])
    store.put("k2", caps[2])
    assert sorted(store.keys()) == ["k1", "k2"] and len(list(tmp_path.glob("*.capsule"))) == 2


def test_replace_and_remove(arena, tmp_path):
    caps = _capsules(arena, 2)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path)
    store.put("k", caps[0])
    store.put("k", caps[1])
    assert len(list(tmp_path.glob("*.capsule"))) == 1
    assert dict(store.get("k").digests) == dict(caps[1].digests)
    store.remove("k")
    assert "k" not in store and not list(tmp_path.glob("*.capsule"))
    assert store.stats().bytes == {"device": 0, "host": 0, "disk": 0}


def test_bad_arguments():
    with pytest.raises(ValueError, match="non-negative"):
        CapsuleStore(device_bytes=-1)
    with pytest.raises(ValueError, match="disk_dir"):
        CapsuleStore(disk_bytes=10)
    store = CapsuleStore()
    with pytest.raises(ValueError, match="non-empty"):
        store.put("", None)
    with pytest.raises(TypeError, match="Capsule"):
        store.put("k", object())


def _disk_state(store, tmp_path):
    files = sorted(tmp_path.glob("*.capsule"))
    return files, sum(p.stat().st_size for p in files)


def test_loading_from_disk_keeps_the_file_and_a_second_demotion_reuses_it(arena, tmp_path, monkeypatch):
    import capsule_rollout.capsules.capsule_store as store_module

    caps = _capsules(arena, 2)
    size = caps[0].nbytes
    saves = []
    original_save = store_module.save_capsule
    monkeypatch.setattr(store_module, "save_capsule", lambda *a, **kw: saves.append(a[1]) or original_save(*a, **kw))
    store = CapsuleStore(device_bytes=size, host_bytes=0, disk_dir=tmp_path)
    store.put("k0", caps[0])
    store.put("k1", caps[1])  # k0: device -> host (budget 0) -> disk
    assert store.tier_of("k0") is Tier.DISK and len(saves) == 1
    (k0_file,), _ = _disk_state(store, tmp_path)
    got = store.get("k0")  # k0 back on the device, k1 down to disk
    assert dict(got.digests) == dict(caps[0].digests) and store.tier_of("k0") is Tier.DEVICE
    files, disk_bytes = _disk_state(store, tmp_path)
    assert k0_file in files and len(files) == 2 and len(saves) == 2  # k0's file kept, k1's written
    stats = store.stats()
    assert stats.bytes == {"device": size, "host": 0, "disk": disk_bytes}
    assert stats.entries == {"device": 1, "host": 0, "disk": 2}  # k0 is in two tiers
    inode = k0_file.stat().st_ino
    store.get("k1")  # k0 demoted again: its file is reused, not rewritten
    assert store.tier_of("k0") is Tier.DISK and len(saves) == 2 and k0_file.stat().st_ino == inode
    files, disk_bytes = _disk_state(store, tmp_path)
    assert len(files) == 2 and store.stats().bytes == {"device": size, "host": 0, "disk": disk_bytes}
    store.remove("k0")
    files, disk_bytes = _disk_state(store, tmp_path)
    assert k0_file not in files and store.stats().bytes["disk"] == disk_bytes


def test_over_the_disk_budget_a_loaded_capsule_loses_only_its_disk_copy(arena, tmp_path):
    caps = _capsules(arena, 2)
    size = caps[0].nbytes
    probe = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path / "probe")
    probe.put("x", caps[0])
    file_size = probe.stats().bytes["disk"]
    store = CapsuleStore(device_bytes=size, host_bytes=0, disk_dir=tmp_path / "d", disk_bytes=file_size)
    store.put("k0", caps[0])
    store.put("k1", caps[1])  # k0 on disk
    store.get("k0")  # k0 loaded (file kept), k1 written: two files over a one-file budget
    files, disk_bytes = _disk_state(store, tmp_path / "d")
    assert len(files) == 1 and disk_bytes == file_size == store.stats().bytes["disk"]
    assert store.tier_of("k0") is Tier.DEVICE and store.tier_of("k1") is Tier.DISK  # k0's older file went
    assert store.stats().dropped == 0
    assert dict(store.get("k0").digests) == dict(caps[0].digests)


def _infinity_step(path):
    """`"step": Infinity` in the file's metadata, its sha256 recomputed (so the JSON check is what refuses it)."""
    import hashlib
    import json
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    block = header["__metadata__"]
    assert '"step": 0' in block["meta"]
    block["meta"] = block["meta"].replace('"step": 0', '"step": Infinity')
    block["meta_sha256"] = hashlib.sha256(block["meta"].encode()).hexdigest()
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def _infinity_offset(path):
    """A tensor's end offset written as Infinity in the safetensors header."""
    import json
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    text = data[8 : 8 + n].decode()
    key = next(k for k in json.loads(text) if k != "__metadata__")
    start, end = json.loads(text)[key]["data_offsets"]
    old = f'"data_offsets":[{start},{end}]'
    assert old in text
    raw = text.replace(old, f'"data_offsets":[{start},Infinity]').encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def test_a_file_with_infinity_in_its_header_is_set_aside_when_the_store_opens(arena, tmp_path):
    caps = _capsules(arena, 2)
    first = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path)
    first.put("bad", caps[0])
    first.put("good", caps[1])
    bad_path = first._entries["bad"].path
    _infinity_offset(bad_path)
    again = CapsuleStore(disk_dir=tmp_path)  # opens despite the bad file
    assert again.keys() == ["good"] and [p for p, _ in again.skipped_files] == [bad_path]
    assert bad_path.with_name(bad_path.name + ".corrupt").exists() and not bad_path.exists()
    assert dict(again.get("good").digests) == dict(caps[1].digests)


def test_a_file_damaged_after_opening_is_set_aside_and_forgotten_by_get(arena, tmp_path):
    (cap,) = _capsules(arena, 1)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path)
    store.put("k", cap)
    path = store._entries["k"].path
    _infinity_step(path)
    with pytest.raises(CapsuleFormatError, match="not valid JSON"):
        store.get("k")
    assert "k" not in store and path.with_name(path.name + ".corrupt").exists()
    assert store.stats().bytes == {"device": 0, "host": 0, "disk": 0}


def test_with_a_key_the_disk_tier_reads_back_only_what_it_signed(arena, tmp_path):
    from capsule_rollout.capsules import CapsuleSignatureError, load_capsule, save_capsule

    key = "the-store-s-key-0123456789abcdef"
    caps = _capsules(arena, 2)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path, key=key)
    store.put("mine", caps[0])
    store.put("swapped", caps[1])
    assert dict(store.get("mine").digests) == dict(caps[0].digests)  # signed when demoted, checked when read back
    path = store._entries["swapped"].path
    load_capsule(path, key=key)  # the file on disk is signed
    save_capsule(caps[1], path, annotations={"store_key": "swapped"}, key=None)  # replaced by an unsigned one
    with pytest.raises(CapsuleSignatureError, match="not signed"):
        store.get("swapped")
    assert "swapped" not in store and path.with_name(path.name + ".corrupt").exists()


# -- what the scan on open trusts ---------------------------------------------------------------------------------

STORE_KEY = "the-store-s-key-0123456789abcdef"
OTHER_KEY = "somebody-else-s-key-0123456789ab"


def _signed_store_file(arena, tmp_path):
    """A signed store's file for key "k" (caps[0]) and a second capsule (caps[1]) to forge files with."""
    caps = _capsules(arena, 2)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path, key=STORE_KEY)
    store.put("k", caps[0])
    return caps, store._entries["k"].path


def _newer_than(path, other, seconds=100):
    import os

    t = other.stat().st_mtime + seconds
    os.utime(path, (t, t))


@pytest.mark.parametrize("forgery", ["unsigned", "other key", "damaged copy"])
def test_a_file_that_fails_verification_never_displaces_the_signed_one(arena, tmp_path, forgery):
    from capsule_rollout.capsules import save_capsule

    caps, signed = _signed_store_file(arena, tmp_path)
    signed_bytes = signed.read_bytes()
    forged = tmp_path / "forged.capsule"
    if forgery == "damaged copy":  # the signed file with one data byte changed
        forged.write_bytes(signed_bytes[:-1] + bytes([signed_bytes[-1] ^ 0xFF]))
    else:
        save_capsule(caps[1], forged, annotations={"store_key": "k"}, key=None if forgery == "unsigned" else OTHER_KEY)
    _newer_than(forged, signed)  # newer by mtime: today's tie-break would keep it and delete the signed file
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path, key=STORE_KEY)
    assert signed.read_bytes() == signed_bytes  # still there, untouched
    assert store.keys() == ["k"] and dict(store.get("k").digests) == dict(caps[0].digests)
    ((path, reason),) = store.skipped_files
    assert path == forged and ("not signed" if forgery == "unsigned" else "does not match this key") in reason
    assert not forged.exists() and forged.with_name(forged.name + ".corrupt").exists()  # set aside, not deleted


@pytest.mark.parametrize("newer_mtime", ["first", "second"])
def test_two_signed_files_for_one_key_keep_the_later_created_and_delete_neither(arena, tmp_path, newer_mtime):
    from capsule_rollout.capsules import save_capsule

    caps, first = _signed_store_file(arena, tmp_path)
    assert caps[1].meta.created_at > caps[0].meta.created_at
    second = save_capsule(caps[1], tmp_path / "second.capsule", annotations={"store_key": "k"}, key=STORE_KEY)
    contents = {first.read_bytes(), second.read_bytes()}
    if newer_mtime == "first":
        _newer_than(first, second)
    else:
        _newer_than(second, first)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path, key=STORE_KEY)
    assert {p.read_bytes() for p in tmp_path.iterdir()} == contents  # neither unlinked, whatever the mtimes
    assert dict(store.get("k").digests) == dict(caps[1].digests)  # the later created_at (signed), not mtime
    ((path, reason),) = store.skipped_files
    assert path == first and "created later" in reason
    assert second.exists() and first.with_name(first.name + ".duplicate").exists() and not first.exists()


def test_without_a_key_the_scan_takes_headers_at_their_word_but_deletes_nothing(arena, tmp_path):
    from capsule_rollout.capsules import save_capsule

    caps = _capsules(arena, 2)
    later = save_capsule(caps[1], tmp_path / "later.capsule", annotations={"store_key": "k"}, key=None)
    earlier = save_capsule(caps[0], tmp_path / "earlier.capsule", annotations={"store_key": "k"}, key=None)
    _newer_than(earlier, later)
    store = CapsuleStore(disk_dir=tmp_path, key=None)
    assert dict(store.get("k").digests) == dict(caps[1].digests)  # created later, by its (unsigned) header
    assert [p for p, _ in store.skipped_files] == [earlier]
    assert later.exists() and earlier.with_name(earlier.name + ".duplicate").exists()


def test_opening_over_the_disk_budget_deletes_nothing_the_next_put_trims(arena, tmp_path):
    caps = _capsules(arena, 3)
    first = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path)
    first.put("k0", caps[0])
    first.put("k1", caps[1])
    files, disk_bytes = _disk_state(first, tmp_path)
    store = CapsuleStore(device_bytes=0, host_bytes=0, disk_dir=tmp_path, disk_bytes=disk_bytes // 2)
    assert _disk_state(store, tmp_path)[0] == files and sorted(store.keys()) == ["k0", "k1"]
    store.put("k2", caps[2])
    assert store.keys() == ["k2"] and len(_disk_state(store, tmp_path)[0]) == 1


def test_a_set_aside_file_never_overwrites_an_earlier_one(arena, tmp_path):
    from capsule_rollout.capsules import save_capsule

    caps, signed = _signed_store_file(arena, tmp_path)
    forged = tmp_path / "forged.capsule"
    for _ in range(2):
        save_capsule(caps[1], forged, annotations={"store_key": "k"}, key=None)
        CapsuleStore(disk_dir=tmp_path, key=STORE_KEY)
    assert sorted(p.name for p in tmp_path.glob("*.corrupt")) == ["forged.capsule.1.corrupt", "forged.capsule.corrupt"]
    assert signed.exists()
