import json
import struct

import pytest
import torch

from capsules import (
    CapsuleFormatError,
    CapsuleIntegrityError,
    CapsuleMismatchError,
    capsule_from_bytes,
    capsule_to_bytes,
    load_capsule,
    restore,
    save_capsule,
    snapshot,
)
from capsules.capsule_file import FORMAT_VERSION, read_file_header
from tests.capsules.fakes import fill_state, make_arena, same_bytes, state_copy


@pytest.fixture
def capsule():
    arena, _ = make_arena()
    fill_state(arena, 11)
    return snapshot(arena, label="disk", step=3, episode="e", extra={"seed": "9"})


def _rewrite_meta(data: bytes, edit) -> bytes:
    """Edit the safetensors header JSON, keeping tensor data and offsets valid."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def test_file_round_trip_keeps_bytes_meta_and_digests(tmp_path, capsule):
    path = save_capsule(capsule, tmp_path / "a.capsule")
    loaded = load_capsule(path)
    assert loaded.meta == capsule.meta
    assert dict(loaded.digests) == dict(capsule.digests)
    assert loaded.specs == capsule.specs
    for k in capsule.specs:
        assert same_bytes(loaded.buffer(k), capsule.buffer(k))
    assert [p.name for p in tmp_path.iterdir()] == ["a.capsule"]  # no temp file left behind
    assert read_file_header(path)["label"] == "disk"


def test_loaded_capsule_restores_bit_exact(tmp_path, capsule):
    arena, _ = make_arena()
    restore(arena, load_capsule(save_capsule(capsule, tmp_path / "a.capsule")))
    for k in capsule.specs:
        assert same_bytes(arena.buffer(k), capsule.buffer(k))


def test_format_is_safetensors_with_json_meta_not_pickle(capsule):
    data = capsule_to_bytes(capsule)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    assert header["__metadata__"]["format_version"] == str(FORMAT_VERSION)
    assert json.loads(header["__metadata__"]["meta"])["step"] == 3
    assert b"\x80\x04\x95" not in data[: 8 + n]  # no pickle protocol-4 frame


@pytest.mark.parametrize("keep", [0, 5, 8, 40, -1, -7])
def test_truncated_data_is_refused(capsule, keep):
    data = capsule_to_bytes(capsule)
    cut = data[:keep] if keep >= 0 else data[:keep]
    with pytest.raises(CapsuleFormatError, match="truncated|too short|not a capsule"):
        capsule_from_bytes(cut)


def test_tampered_tensor_byte_is_refused_naming_the_buffer(capsule):
    data = bytearray(capsule_to_bytes(capsule))
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    start = 8 + n + header["comp/img"]["data_offsets"][0]
    data[start] ^= 0xFF
    with pytest.raises(CapsuleIntegrityError, match="comp/img"):
        capsule_from_bytes(bytes(data))


def test_wrong_version_and_wrong_format_are_refused(capsule):
    data = capsule_to_bytes(capsule)
    newer = _rewrite_meta(data, lambda h: h["__metadata__"].update(format_version="99"))
    with pytest.raises(CapsuleFormatError, match="version '99'; this build reads version 1"):
        capsule_from_bytes(newer)
    other = _rewrite_meta(data, lambda h: h["__metadata__"].update(format="something-else"))
    with pytest.raises(CapsuleFormatError, match="is not"):
        capsule_from_bytes(other)
    no_meta = _rewrite_meta(data, lambda h: h.pop("__metadata__"))
    with pytest.raises(CapsuleFormatError, match="not a capsule file"):
        capsule_from_bytes(no_meta)


def test_tampered_metadata_is_refused(capsule):
    data = capsule_to_bytes(capsule)

    def bad_digest(h):
        meta = json.loads(h["__metadata__"]["meta"])
        meta["digests"]["comp/h"] = "0" * 16
        h["__metadata__"]["meta"] = json.dumps(meta)

    with pytest.raises(CapsuleIntegrityError, match="comp/h"):
        capsule_from_bytes(_rewrite_meta(data, bad_digest))

    def bad_shape(h):
        meta = json.loads(h["__metadata__"]["meta"])
        meta["specs"]["comp/h"]["shape"] = [3, 2, 1]
        h["__metadata__"]["meta"] = json.dumps(meta)

    with pytest.raises(CapsuleIntegrityError, match="comp/h"):
        capsule_from_bytes(_rewrite_meta(data, bad_shape))

    def drop_spec(h):
        meta = json.loads(h["__metadata__"]["meta"])
        del meta["specs"]["comp/h"]
        h["__metadata__"]["meta"] = json.dumps(meta)

    with pytest.raises(CapsuleFormatError, match="undeclared"):
        capsule_from_bytes(_rewrite_meta(data, drop_spec))

    def garbage_meta(h):
        h["__metadata__"]["meta"] = "[1, 2"

    with pytest.raises(CapsuleFormatError, match="not valid JSON"):
        capsule_from_bytes(_rewrite_meta(data, garbage_meta))


def test_garbage_and_missing_files(tmp_path):
    junk = tmp_path / "junk.capsule"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(CapsuleFormatError):
        load_capsule(junk)
    with pytest.raises(CapsuleFormatError, match="no such capsule file"):
        load_capsule(tmp_path / "missing.capsule")


def test_refused_file_never_touches_a_live_arena(tmp_path, capsule):
    arena, comp = make_arena()
    fill_state(arena, 77)
    before = state_copy(arena)
    path = save_capsule(capsule, tmp_path / "a.capsule")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x55
    path.write_bytes(bytes(data))
    with pytest.raises((CapsuleIntegrityError, CapsuleFormatError)):
        restore(arena, load_capsule(path))
    other, _ = make_arena(fingerprint={"weights": "different"})
    foreign = save_capsule(snapshot(other), tmp_path / "foreign.capsule")
    with pytest.raises(CapsuleMismatchError):
        restore(arena, load_capsule(foreign))
    for k, v in before.items():
        assert same_bytes(arena.buffer(k), v)
    assert "after_restore" not in comp.calls


def test_tampered_bool_byte_is_caught_even_if_it_still_reads_true(capsule):
    data = bytearray(capsule_to_bytes(capsule))
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    mask = capsule.buffer("comp/mask")
    i = int(mask.to(torch.uint8).argmax())  # a True element
    assert bool(mask[i])
    data[8 + n + header["comp/mask"]["data_offsets"][0] + i] = 0x7F
    with pytest.raises(CapsuleIntegrityError, match="comp/mask"):
        capsule_from_bytes(bytes(data))


def test_annotations_travel_in_the_header(tmp_path, capsule):
    path = save_capsule(capsule, tmp_path / "a.capsule", annotations={"store_key": "seed-1"})
    assert read_file_header(path)["annotations"] == {"store_key": "seed-1"}
    assert torch.equal(load_capsule(path).buffer("comp/count"), capsule.buffer("comp/count"))
