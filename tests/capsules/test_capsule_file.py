import hashlib
import json
import struct

import pytest
import torch

from capsule_rollout.capsules import (
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
from capsule_rollout.capsules.capsule_file import FORMAT_VERSION, read_file_header
from tests.capsules.fakes import fill_state, make_arena, same_bytes, state_copy


@pytest.fixture
def capsule():
    arena, _ = make_arena()
    fill_state(arena, 11)
    return snapshot(arena, label="disk", step=3, episode="e", extra={"seed": "9"})


def _rewrite_meta(data: bytes, edit, *, rehash: bool = True) -> bytes:
    """Edit the safetensors header JSON, keeping tensor data and offsets valid.

    `rehash`: recompute the metadata's sha256 after the edit (what a deliberate edit does),
    so the checks behind it are reached.
    """
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    block = header.get("__metadata__")
    if rehash and isinstance(block, dict) and isinstance(block.get("meta"), str) and "meta_sha256" in block:
        block["meta_sha256"] = hashlib.sha256(block["meta"].encode()).hexdigest()
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

    with pytest.raises(CapsuleFormatError, match="'comp/h' is stored as float32\\[2, 3\\] but its spec says "
                       "float32\\[3, 2, 1\\]: the header's dtype or shape was relabelled"):
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


def _edit_header_text(data: bytes, old: str, new: str) -> bytes:
    """Replace text in the raw header (for values json.dumps would never write, e.g. Infinity)."""
    (n,) = struct.unpack("<Q", data[:8])
    text = data[8 : 8 + n].decode()
    assert old in text, old
    raw = text.replace(old, new, 1).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n :]


def _set_in_meta(path: tuple, value):
    def edit(h):
        meta = json.loads(h["__metadata__"]["meta"])
        target = meta
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        h["__metadata__"]["meta"] = json.dumps(meta)  # allow_nan: writes Infinity / NaN

    return edit


@pytest.mark.parametrize("where", [("step",), ("created_at",), ("specs", "comp/h", "shape"), ("specs", "comp/count",
                                                                                             "alignment")])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300, 2.5, True])
def test_non_finite_or_mistyped_metadata_values_are_format_errors(capsule, where, value):
    if where[-1] == "shape":
        value = [value, 3]
    if where == ("created_at",) and value in (1e300, 2.5):
        return  # a finite float is a valid creation time
    damaged = _rewrite_meta(capsule_to_bytes(capsule), _set_in_meta(where, value))
    with pytest.raises(CapsuleFormatError):
        capsule_from_bytes(damaged)


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_infinity_in_the_tensor_table_is_a_format_error(capsule, number):
    data = capsule_to_bytes(capsule)
    (n,) = struct.unpack("<Q", data[:8])
    offsets = json.loads(data[8 : 8 + n])["comp/h"]["data_offsets"]
    damaged = _edit_header_text(data, f'"data_offsets":[{offsets[0]},{offsets[1]}]',
                                f'"data_offsets":[{offsets[0]},{number}]')
    with pytest.raises(CapsuleFormatError, match="not valid JSON|malformed tensor table"):
        capsule_from_bytes(damaged)


def test_a_relabelled_tensor_dtype_is_called_a_relabel_not_a_digest_mismatch(capsule):
    def relabel(h):
        h["comp/h"]["dtype"] = "I32"  # same item size: safetensors reads it, the spec says float32

    with pytest.raises(CapsuleFormatError, match="'comp/h' is stored as int32\\[2, 3\\] but its spec says float32"):
        capsule_from_bytes(_rewrite_meta(capsule_to_bytes(capsule), relabel))


def test_a_header_over_the_size_limit_is_not_called_truncated(tmp_path, capsule):
    from capsule_rollout.capsules.capsule_file import MAX_HEADER_BYTES

    data = capsule_to_bytes(capsule)
    big = struct.pack("<Q", MAX_HEADER_BYTES + 1) + data[8:]
    for load in (capsule_from_bytes, lambda d: read_file_header(_write(tmp_path, d))):
        with pytest.raises(CapsuleFormatError, match="over the .*-byte limit") as info:
            load(big)
        assert "truncated" not in str(info.value)


def _write(tmp_path, data: bytes):
    path = tmp_path / "x.capsule"
    path.write_bytes(data)
    return path


def test_damaged_identity_metadata_is_refused(capsule):
    data = capsule_to_bytes(capsule)
    flipped = _edit_header_text(data, '\\"step\\": 3', '\\"step\\": 2')  # one bit: 0x33 -> 0x32
    assert len(flipped) == len(data)
    with pytest.raises(CapsuleFormatError, match="does not match its sha256"):
        capsule_from_bytes(flipped)
    unknown = _rewrite_meta(data, lambda h: h["__metadata__"].update(signer="x"))
    with pytest.raises(CapsuleFormatError, match="unknown entries \\['signer'\\]"):
        capsule_from_bytes(unknown)


def test_a_file_without_the_metadata_sha256_still_loads(capsule):
    legacy = _rewrite_meta(capsule_to_bytes(capsule), lambda h: h["__metadata__"].pop("meta_sha256"))
    assert capsule_from_bytes(legacy).meta == capsule.meta


def test_a_spec_whose_name_is_not_its_key_is_refused(capsule):
    damaged = _rewrite_meta(capsule_to_bytes(capsule), _set_in_meta(("specs", "comp/h", "name"), "other"))
    with pytest.raises(CapsuleFormatError, match="spec 'comp/h' names buffer 'other'"):
        capsule_from_bytes(damaged)


KEY = "lab-key-0123456789abcdef"


def test_a_signed_capsule_loads_with_its_key_and_is_refused_with_another_or_unsigned(capsule, tmp_path):
    from capsule_rollout.capsules import CapsuleSignatureError, load_capsule, save_capsule

    signed = save_capsule(capsule, tmp_path / "signed.capsule", key=KEY)
    assert load_capsule(signed, key=KEY).meta == capsule.meta
    assert load_capsule(signed, key=None).meta == capsule.meta  # the signature not checked: digests only
    with pytest.raises(CapsuleSignatureError, match="does not match this key"):
        load_capsule(signed)  # by default, the user's key (capsules.signing_key): another one here
    with pytest.raises(CapsuleSignatureError, match="does not match this key"):
        load_capsule(signed, key="another-key-0123456789")
    unsigned = save_capsule(capsule, tmp_path / "unsigned.capsule", key=None)
    with pytest.raises(CapsuleSignatureError, match="not signed"):
        load_capsule(unsigned, key=KEY)
    with pytest.raises(CapsuleSignatureError, match="not signed"):
        load_capsule(unsigned)  # every loader checks the user's key unless told otherwise
    assert load_capsule(save_capsule(capsule, tmp_path / "mine.capsule")).meta == capsule.meta  # signed by default
    with pytest.raises(ValueError, match="too short to sign with"):
        save_capsule(capsule, tmp_path / "weak.capsule", key="short")


def test_a_crafted_capsule_passes_the_digests_but_not_the_key(capsule):
    """A forger who changes the state and lets the digests be recomputed (what the digests cannot catch), then
    moves the original's signature over, is refused when the reader asks for the key."""
    from capsule_rollout.capsules import Capsule, CapsuleSignatureError

    signature = json.loads(_header(capsule_to_bytes(capsule, key=KEY)))["__metadata__"]["signature"]
    slabs = [(layout, slab.clone()) for layout, slab in capsule.slabs()]
    forged_capsule = Capsule(capsule.meta, slabs)
    key = next(iter(capsule.specs))
    forged_capsule.buffer(key).view(-1)[0] += 1  # the physics a forger wants
    forged = _rewrite_meta(capsule_to_bytes(forged_capsule), lambda h: h["__metadata__"].update(signature=signature))
    assert capsule_from_bytes(forged).meta.label == capsule.meta.label  # consistent digests: accepted without a key
    with pytest.raises(CapsuleSignatureError, match="changed since it was signed"):
        capsule_from_bytes(forged, key=KEY)


def _header(data: bytes) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    return data[8 : 8 + n]
