"""Hostile and damaged files: bounded memory, one documented error naming the file, atomic saves, all-or-nothing
load_state_dict (issue 12). Every hostile file is built byte by byte here, so torch is not needed."""
from __future__ import annotations

import io
import json
import os
import pickle
import random
import struct
import threading
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest

import runtime
from runtime import nn
from runtime.serialization import UnreadableFileError, _save_runtime, load, load_safetensors, save, save_safetensors

MiB = 1 << 20
SLACK = 16 * MiB  # the "small constant" a load may allocate beyond the file's size and its real data


# ------------------------------------------------------------------------------------------------
# building files byte by byte (no torch needed)
# ------------------------------------------------------------------------------------------------

def saved_bytes(obj, writer=None) -> bytes:
    """obj in runtime's own format (runtime.save writes torch's where it can: pass writer=save for that)."""
    buffer = io.BytesIO()
    (writer or _save_runtime)(obj, buffer)
    return buffer.getvalue()


def zip_bytes(entries: dict, compression=zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


def zip_entries(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def central_records(data: bytes) -> dict:
    """name -> byte position of its central-directory record."""
    found, position = {}, data.find(b"PK\x01\x02")
    while position >= 0:
        name_size = struct.unpack_from("<H", data, position + 28)[0]
        found[data[position + 46:position + 46 + name_size].decode()] = position
        position = data.find(b"PK\x01\x02", position + 46)
    return found


def patch_directory(data: bytes, name: str, **fields) -> bytes:
    """Rewrite fields of one entry's central-directory record: flags, method, compressed, size, offset."""
    layout = {"flags": (8, "<H"), "method": (10, "<H"), "compressed": (20, "<I"), "size": (24, "<I"),
              "offset": (42, "<I")}
    patched, where = bytearray(data), central_records(data)[name]
    for field, value in fields.items():
        offset, fmt = layout[field]
        struct.pack_into(fmt, patched, where + offset, value)
    return bytes(patched)


def push(value) -> bytes:
    """Pickle opcodes (protocol 2, no memo) that push one plain value."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=2)
    pickler.fast = True
    pickler.dump(value)
    return out.getvalue()[2:-1]


def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def torch_pickle(numel: int, key: str = "0", memo_index: int | None = None) -> bytes:
    """torch.save's data.pkl for {"w": a float32 tensor of numel elements in storage `key`}, written by hand."""
    memo = b"" if memo_index is None else b"r" + struct.pack("<I", memo_index)
    return b"\x80\x02}" + memo + push("w") + _tensor_ops(key, numel) + b"s."


def torch_zip(pickled: bytes, storages: dict | None = None, compression=zipfile.ZIP_STORED) -> bytes:
    entries = {"archive/data.pkl": pickled, "archive/byteorder": b"little"}
    entries.update({f"archive/data/{k}": v for k, v in (storages or {}).items()})
    return zip_bytes(entries, compression)


def safetensors_bytes(header, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


# ------------------------------------------------------------------------------------------------
# measuring
# ------------------------------------------------------------------------------------------------

def traced_load(loader, source):
    """(result or exception, peak bytes allocated during the call), as tracemalloc sees them (numpy included)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        outcome = loader(source)
    except Exception as e:  # noqa: BLE001 - the caller checks the type
        outcome = e
    peak = tracemalloc.get_traced_memory()[1] - base
    if started:
        tracemalloc.stop()
    return outcome, peak


def write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def assert_unreadable(outcome, path, *patterns):
    assert isinstance(outcome, UnreadableFileError), f"{path.name}: {type(outcome).__name__}: {outcome}"
    assert path.name in str(outcome) and path.name in outcome.filename
    for pattern in patterns:
        assert pattern in str(outcome), str(outcome)


# ------------------------------------------------------------------------------------------------
# 1. loading allocates at most the file's size, its real data and a small constant
# ------------------------------------------------------------------------------------------------

def test_the_hand_built_torch_pickle_loads():
    weights = np.arange(6, dtype=np.float32)
    loaded = load(io.BytesIO(torch_zip(torch_pickle(6), {"0": weights.tobytes()})))
    assert loaded["w"].tolist() == weights.tolist()


def test_a_huge_memo_index_allocates_nothing(tmp_path):
    # LONG_BINPUT 2**24: the C unpickler sized its memo to 2**25 pointers (256 MiB) for a file of ~400 bytes.
    path = write(tmp_path, "memo.pt", torch_zip(torch_pickle(2, memo_index=1 << 24), {"0": bytes(8)}))
    outcome, peak = traced_load(load, path)
    assert_unreadable(outcome, path, "memo index 16777216")
    assert peak < path.stat().st_size + SLACK, peak


def test_a_memo_index_that_was_memoized_before_is_accepted():
    pickled = torch_pickle(2, memo_index=0)
    assert load(io.BytesIO(torch_zip(pickled, {"0": bytes(8)})))["w"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("opcode", [b"B", b"T", b"X", b"\x8e"])  # BINBYTES, BINSTRING, BINUNICODE, BINBYTES8
def test_a_pickle_declaring_a_huge_length_allocates_nothing(tmp_path, opcode):
    length = struct.pack("<Q" if opcode == b"\x8e" else "<I", 1 << 28)
    path = write(tmp_path, "long.pt", torch_zip(b"\x80\x02" + opcode + length + b"abc"))
    outcome, peak = traced_load(load, path)
    assert_unreadable(outcome, path)
    assert peak < path.stat().st_size + SLACK, peak


def test_a_declared_storage_larger_than_the_file_is_not_allocated(tmp_path):
    # The directory claims 256 MiB for a storage the file does not hold: refuse before allocating it.
    data = torch_zip(torch_pickle(1 << 26), {"0": bytes(16)})
    data = patch_directory(data, "archive/data/0", compressed=1 << 28, size=1 << 28)
    path = write(tmp_path, "declared.pt", data)
    outcome, peak = traced_load(load, path)
    assert_unreadable(outcome, path, "archive/data/0", "runs past the end")
    assert peak < path.stat().st_size + SLACK, peak


def test_a_runtime_file_declaring_a_huge_storage_is_not_allocated(tmp_path):
    entries = zip_entries(saved_bytes({"w": runtime.ones(4)}))
    structure = json.loads(entries["runtime_save/structure.json"])
    structure["storages"] = [1 << 28]
    structure["tensors"][0].update(shape=[1 << 26], strides=[4])
    entries["runtime_save/structure.json"] = json.dumps(structure).encode()
    data = patch_directory(zip_bytes(entries), "runtime_save/storages/0", compressed=1 << 28, size=1 << 28)
    path = write(tmp_path, "declared_runtime.pt", data)
    outcome, peak = traced_load(load, path)
    assert_unreadable(outcome, path, "runtime_save/storages/0")
    assert peak < path.stat().st_size + SLACK, peak


def local_header(name: bytes, size: int, crc: int) -> bytes:
    return struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0x21, crc, size, size, len(name), 0) + name


def overlapping_zip(pickled: bytes, names: list, block: bytes) -> bytes:
    """A zip whose stored entries overlap (a non-recursive zip bomb): entry i's data is the local headers of
    entries i+1.. followed by one shared block, so every entry is valid and all of them end in the same bytes."""
    tails, tail = [], block
    for name in reversed(names):
        tails.append(tail)
        tail = local_header(name, len(tail), zlib.crc32(tail)) + tail
    tails.reverse()
    records, offset = [], 0
    for i, name in enumerate(names):
        records.append((name, len(tails[i]), zlib.crc32(tails[i]), offset))
        offset += 30 + len(name)
    body = tail
    records.append((b"archive/data.pkl", len(pickled), zlib.crc32(pickled), len(body)))
    body += local_header(b"archive/data.pkl", len(pickled), zlib.crc32(pickled)) + pickled
    directory = b"".join(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, crc, size, size,
                                     len(name), 0, 0, 0, 0, 0, at) + name for name, size, crc, at in records)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(records), len(records), len(directory), len(body), 0)
    return body + directory + end


def test_overlapping_entries_are_not_read_twice(tmp_path):
    # Eight storages that all end in the same 4 MiB: reading each would allocate 32 MiB for a 4 MiB file.
    # Together they claim more bytes than the file holds, so the loader stops at the second.
    names = [f"archive/data/{i}".encode() for i in range(8)]
    block = bytes(4 * MiB)
    sizes = [len(block) + (len(names) - 1 - i) * (30 + len(names[0])) for i in range(len(names))]
    pickled = b"\x80\x02}" + b"".join(push(f"w{i}") + _tensor_ops(str(i), n // 4) + b"s" for i, n in enumerate(sizes))
    data = overlapping_zip(pickled + b".", names, block)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # a well-formed archive, as far as zipfile can tell
        assert archive.testzip() is None and len(archive.namelist()) == 9
    path = write(tmp_path, "overlap.pt", data)
    outcome, peak = traced_load(load, path)
    assert_unreadable(outcome, path, "overlapping entries")
    assert peak < path.stat().st_size + SLACK, peak


def _tensor_ops(key: str, numel: int) -> bytes:
    storage = b"(" + push("storage") + glob("torch", "FloatStorage") + push(key) + push("cpu") + push(numel) + b"tQ"
    return (glob("torch._utils", "_rebuild_tensor_v2") + b"(" + storage + push(0) + push((numel,)) + push((1,))
            + push(False) + glob("collections", "OrderedDict") + b")RtR")


def _zeros_deflated(name: str, prefix: bytes, size: int) -> bytes:
    """A zip with one deflated entry: prefix then `size` zero bytes, compressed without holding them all."""
    out = io.BytesIO()
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(out, "w") as archive:
        with archive.open(info, "w", force_zip64=True) as entry:
            entry.write(prefix)
            chunk = bytes(MiB)
            for _ in range(size // MiB):
                entry.write(chunk)
    return out.getvalue()


def test_an_entry_that_inflates_1000x_is_not_inflated(tmp_path):
    # runtime.save and torch.save store entries uncompressed; a deflated data.pkl of 64 MiB (a valid
    # pickle, then zeros) is about 64 KB in the file. It used to be inflated (twice over) and then loaded.
    data = _zeros_deflated("archive/data.pkl", b"\x80\x02}.", 64 * MiB)
    assert len(data) < 128 * 1024
    path = write(tmp_path, "bomb.pt", data)
    outcome, peak = traced_load(load, path)
    assert_unreadable(outcome, path, "compressed entry 'archive/data.pkl'")
    assert peak < path.stat().st_size + SLACK, peak


def test_a_compressed_storage_is_refused_before_inflating(tmp_path):
    numel = 16 * MiB
    data = torch_zip(torch_pickle(numel), {"0": bytes(4 * numel)}, zipfile.ZIP_DEFLATED)
    path = write(tmp_path, "deflated.pt", data)
    outcome, peak = traced_load(load, path)
    assert_unreadable(outcome, path, "compressed entry")
    assert peak < path.stat().st_size + SLACK, peak


@pytest.mark.parametrize("kind", ["runtime", "torch", "safetensors"])
def test_a_valid_file_needs_its_data_once(tmp_path, kind):
    # Reading a stored entry goes straight into the tensor's buffer: one copy of the data, not two or three.
    weights = np.arange(8 * MiB, dtype=np.float32)  # 32 MiB
    if kind == "runtime":
        path = tmp_path / "big.pt"
        save({"w": runtime.from_numpy(weights)}, path)
    elif kind == "torch":
        path = write(tmp_path, "big.pt", torch_zip(torch_pickle(weights.size), {"0": weights.tobytes()}))
    else:
        path = tmp_path / "big.safetensors"
        save_safetensors({"w": runtime.from_numpy(weights)}, path)
    outcome, peak = traced_load(load_safetensors if kind == "safetensors" else load, path)
    assert np.array_equal(outcome["w"].numpy(), weights)
    assert peak < weights.nbytes + 4 * MiB, peak


# ------------------------------------------------------------------------------------------------
# 2. every unreadable file raises UnreadableFileError naming the file and what is wrong
# ------------------------------------------------------------------------------------------------

def _runtime_file() -> bytes:
    return saved_bytes({"w": runtime.ones(2, 3), "step": 3})


def _end_record(data: bytes) -> int:
    return data.rindex(b"PK\x05\x06")


def _shift_directory_offset(data: bytes, by: int) -> bytes:
    patched = bytearray(data)
    where = _end_record(data) + 16
    struct.pack_into("<I", patched, where, struct.unpack_from("<I", data, where)[0] + by)
    return bytes(patched)


def _nested_structure(depth: int) -> bytes:
    entries = zip_entries(_runtime_file())
    structure = json.loads(entries["runtime_save/structure.json"])
    text = json.dumps(structure).replace('"object": ', '"object": ' + "[" * depth, 1)
    text = text.replace(', "tensors"', "]" * depth + ', "tensors"', 1)
    entries["runtime_save/structure.json"] = text.encode()
    return zip_bytes(entries)


_DAMAGED = {
    # safetensors headers
    "dtype_list.safetensors": (lambda: safetensors_bytes({"w": {"dtype": ["F32"], "shape": [1],
                                                                "data_offsets": [0, 4]}}, bytes(4)), "dtype"),
    "dtype_dict.safetensors": (lambda: safetensors_bytes({"w": {"dtype": {}, "shape": [1],
                                                                "data_offsets": [0, 4]}}, bytes(4)), "dtype"),
    "deep.safetensors": (lambda: safetensors_bytes(b"[" * 100_000 + b"]" * 100_000), "nested too deeply"),
    "deep_object.safetensors": (lambda: safetensors_bytes(b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
                                "nested too deeply"),
    "digits.safetensors": (lambda: safetensors_bytes(b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b"]}}"),
                           "not valid JSON"),
    "no_header.safetensors": (lambda: struct.pack("<Q", 1 << 40), "header"),
    "short.safetensors": (lambda: b"\x08\x00", "too short"),
    # runtime.save zips
    "deep.pt": (lambda: _nested_structure(100_000), "nested too deeply"),
    "deep_decode.pt": (lambda: _nested_structure(900), ""),
    "negative_offset.pt": (lambda: _shift_directory_offset(_runtime_file(), 100_000), "damaged directory"),
    "far_offset.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/structure.json", offset=1 << 31),
                      "damaged directory"),
    "deflate64.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/structure.json", method=9),
                     "compressed entry"),
    "bzip2.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/storages/0", method=12), "compressed entry"),
    "lzma.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/storages/0", method=14), "compressed entry"),
    "method99.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/structure.json", method=99),
                    "compressed entry"),
    "encrypted.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/structure.json", flags=1), "encrypted"),
    "encrypted_storage.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/storages/0", flags=1),
                             "encrypted"),
    "local_name.pt": (lambda: _runtime_file().replace(b"structure.json", b"structure.jsoX", 1),
                      "local header does not match"),
    "cd_size.pt": (lambda: patch_directory(_runtime_file(), "runtime_save/storages/0", compressed=5), "declares"),
    "dtype_list.pt": (lambda: _structure_edit(lambda s: s["tensors"][0].update(dtype=["float32"])), "unknown dtype"),
    # torch zips
    "truncated_pickle.pt": (lambda: torch_zip(torch_pickle(2)[:-9], {"0": bytes(8)}), "data.pkl"),
    "unknown_opcode.pt": (lambda: torch_zip(b"\x80\x02\xff.", {}), "data.pkl"),
    "long_digits.pt": (lambda: torch_zip(b"\x80\x02L" + b"9" * 5000 + b"L\n.", {}), "data.pkl"),
    "byteorder.pt": (lambda: zip_bytes({"archive/data.pkl": b"\x80\x02}.", "archive/byteorder": b"\xff" * 10_000}),
                     "byte order"),
    "empty.pt": (lambda: b"", "is empty"),
}


def _structure_edit(change) -> bytes:
    entries = zip_entries(_runtime_file())
    structure = json.loads(entries["runtime_save/structure.json"])
    change(structure)
    entries["runtime_save/structure.json"] = json.dumps(structure).encode()
    return zip_bytes(entries)


@pytest.mark.parametrize("name", sorted(_DAMAGED))
def test_damaged_files_raise_the_documented_error(tmp_path, name):
    build, message = _DAMAGED[name]
    path = write(tmp_path, name, build())
    loader = load_safetensors if name.endswith(".safetensors") else load
    outcome, peak = traced_load(loader, path)
    assert_unreadable(outcome, path, message)
    assert peak < 2 * path.stat().st_size + SLACK, peak


def test_the_error_is_a_runtime_error_and_a_refused_pickle_an_unpickling_error(tmp_path):
    path = write(tmp_path, "global.pt", torch_zip(b"\x80\x02cos\nsystem\n.", {}))
    with pytest.raises(UnreadableFileError) as caught:
        load(path)
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, pickle.UnpicklingError)
    assert "refusing to load the global 'os.system'" in caught.value.reason
    assert runtime.serialization.UnreadableFileError is UnreadableFileError


def test_opening_errors_stay_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError):
        load_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(TypeError, match="binary file object"):
        load(io.StringIO("text"))


@pytest.mark.parametrize("kind", ["runtime", "safetensors", "torch"])
def test_truncated_files_raise_the_documented_error(tmp_path, kind):
    data = _valid_files(tmp_path)[kind]
    path = tmp_path / f"cut.{kind}"
    for size in sorted(set(range(0, len(data), max(1, len(data) // 97))) | {len(data) - 1, 8, 9}):
        path.write_bytes(data[:size])
        outcome, _ = traced_load(load_safetensors if kind == "safetensors" else load, path)
        assert_unreadable(outcome, path)


def test_random_bytes_raise_the_documented_error(tmp_path):
    rng = random.Random(12)
    path = tmp_path / "noise.bin"
    for i in range(200):
        size = rng.choice([0, 1, 7, 8, 9, 22, 64, 300, 5000])
        prefix = rng.choice([b"", b"PK\x03\x04", b"PK\x05\x06", struct.pack("<Q", rng.randrange(size + 2))])
        path.write_bytes(prefix + rng.randbytes(size))
        for loader in (load, load_safetensors):
            outcome, peak = traced_load(loader, path)
            assert_unreadable(outcome, path)
            assert peak < SLACK, peak


# ------------------------------------------------------------------------------------------------
# fuzzing valid files: each variant loads, or raises the documented error, within the memory bound
# ------------------------------------------------------------------------------------------------

def _valid_files(tmp_path) -> dict:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    state = model.state_dict()
    files = {"runtime": saved_bytes({"model": state, "step": 7, "names": ["a", ("b", None)], "lr": 0.5}),
             "runtime.save": saved_bytes({"model": state, "step": 7, "names": ["a", ("b", None)]}, writer=save),
             "torch": torch_zip(torch_pickle(6), {"0": np.arange(6, dtype=np.float32).tobytes()})}
    save_safetensors({k: v for k, v in state.items()}, tmp_path / "valid.safetensors")
    files["safetensors"] = (tmp_path / "valid.safetensors").read_bytes()
    try:
        import torch
    except ImportError:
        return files
    out = io.BytesIO()
    torch.save({k: torch.from_numpy(v.numpy().copy()) for k, v in state.items()}, out)
    files["torch.save"] = out.getvalue()
    return files


_EXTREMES = [0, 1, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    how = rng.randrange(5)
    if how == 0:  # a few random bytes
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif how == 1:  # one bit
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == 2:  # an extreme 16- or 32-bit little-endian integer, where sizes and offsets live
        width = rng.choice([2, 4])
        at = rng.randrange(len(data) - width)
        data[at:at + width] = (rng.choice(_EXTREMES) & ((1 << 8 * width) - 1)).to_bytes(width, "little")
    elif how == 3:  # a cut or a splice
        at = rng.randrange(len(data))
        data = data[:at] + (rng.randbytes(rng.randrange(8)) if rng.random() < 0.5 else b"") + data[at + 1:]
    else:  # a copied run of bytes somewhere else
        start, at = rng.randrange(len(data)), rng.randrange(len(data))
        run = data[start:start + rng.randint(1, 16)]
        data[at:at + len(run)] = run
    return bytes(data)


def _mutate_entries(rng: random.Random, data: bytes) -> bytes:
    """Mutate the bytes inside one zip entry (the JSON structure or the pickle) and re-zip it with a fresh CRC,
    so that the mutation reaches the parsers rather than stopping at the checksum."""
    entries = zip_entries(data)
    name = rng.choice([n for n in entries if n.endswith((".json", ".pkl"))] or list(entries))
    if entries[name]:
        entries[name] = _mutate(rng, entries[name]) if len(entries[name]) > 4 else rng.randbytes(8)
    return zip_bytes(entries)


def test_fuzzed_files_load_or_raise_the_documented_error(tmp_path):
    rng = random.Random(2024)
    files = _valid_files(tmp_path)
    counts = {"loaded": 0, "refused": 0}
    for kind, data in files.items():
        path = tmp_path / f"fuzzed_{kind.replace('.', '_')}.bin"
        for i in range(100 if kind != "torch.save" else 60):
            zipped = kind != "safetensors"
            variant = _mutate_entries(rng, data) if zipped and i % 2 else _mutate(rng, data)
            path.write_bytes(variant)
            for loader in (load, load_safetensors):
                outcome, peak = traced_load(loader, path)
                if not isinstance(outcome, Exception):  # a mutated pickle may load as any plain value
                    counts["loaded"] += 1
                else:
                    counts["refused"] += 1
                    assert_unreadable(outcome, path)
                assert peak < 2 * len(variant) + SLACK, (kind, i, peak)
    assert counts["loaded"] > 20 and counts["refused"] > 300, counts


# ------------------------------------------------------------------------------------------------
# 3. saving is atomic: the previous file, or the new one, never a part
# ------------------------------------------------------------------------------------------------

class _CutShort(Exception):
    pass


def _cut_writer(monkeypatch, how: str, exception):
    def raise_it(*args, **kwargs):
        raise exception("the writer stops here")

    if how == "second entry":
        written = []
        original = runtime.serialization._write_entry

        def write_entry(archive, name, data):
            if written:
                raise_it()
            written.append(name)
            original(archive, name, data)

        monkeypatch.setattr(runtime.serialization, "_write_entry", write_entry)
    else:
        monkeypatch.setattr(runtime.serialization.os, "fsync", raise_it)


@pytest.mark.parametrize("exception", [_CutShort, KeyboardInterrupt])
@pytest.mark.parametrize("saver, how", [(save, "second entry"), (save, "fsync"), (save_safetensors, "fsync")])
def test_a_save_cut_short_leaves_the_previous_file(tmp_path, monkeypatch, saver, how, exception):
    path = tmp_path / "model.bin"
    loader = load_safetensors if saver is save_safetensors else load
    saver({"w": runtime.ones(256)}, path)
    previous = path.read_bytes()
    _cut_writer(monkeypatch, how, exception)
    with pytest.raises(exception, match="stops here"):
        saver({"w": runtime.zeros(256), "b": runtime.zeros(3)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == previous
    assert loader(path)["w"].tolist() == [1.0] * 256
    assert os.listdir(tmp_path) == ["model.bin"]  # no temporary file left behind


def test_a_save_cut_short_leaves_no_file_where_there_was_none(tmp_path, monkeypatch):
    _cut_writer(monkeypatch, "second entry", _CutShort)
    with pytest.raises(_CutShort):
        save({"w": runtime.ones(3)}, tmp_path / "new.pt")
    assert os.listdir(tmp_path) == []


def test_saving_keeps_permissions_and_writes_through_symlinks(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    fresh = tmp_path / "fresh.pt"
    save({"w": runtime.ones(2)}, fresh)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask
    existing = tmp_path / "existing.pt"
    existing.write_bytes(b"old")
    existing.chmod(0o640)
    save({"w": runtime.ones(2)}, existing)
    assert existing.stat().st_mode & 0o777 == 0o640
    link = tmp_path / "link.pt"
    link.symlink_to(existing)
    save({"w": runtime.zeros(2)}, link)
    assert link.is_symlink() and load(existing)["w"].tolist() == [0.0, 0.0]
    assert sorted(os.listdir(tmp_path)) == ["existing.pt", "fresh.pt", "link.pt"]


@pytest.mark.parametrize("saver", [save, save_safetensors])
def test_readers_see_the_old_file_or_the_new_one(tmp_path, saver):
    path = tmp_path / "shared.bin"
    loader = load_safetensors if saver is save_safetensors else load
    versions = [{"w": runtime.full((4096,), float(i))} for i in range(2)]
    saver(versions[0], path)
    done, seen, errors = threading.Event(), set(), []

    def writer():
        try:
            for i in range(60):
                saver(versions[i % 2], path)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set() or len(seen) < 2:
        try:
            values = loader(path)["w"].numpy()
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)
            break
        assert len(set(values.tolist())) == 1
        seen.add(float(values[0]))
        if done.is_set():
            break
    thread.join()
    assert not errors, errors[0]
    assert os.listdir(tmp_path) == ["shared.bin"]


# ------------------------------------------------------------------------------------------------
# 4. load_state_dict: a failed load changes nothing, versions included, for every exception type
# ------------------------------------------------------------------------------------------------

def _model():
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model.train()
    return model


def _observe(model) -> list:
    return [(name, t, t.detach().numpy().copy(), t._version, t.requires_grad, type(t))
            for name, t in [*model.named_parameters(), *model.named_buffers()]]


def _assert_unchanged(model, before) -> None:
    after = _observe(model)
    assert [(n, id(t)) for n, t, *_ in after] == [(n, id(t)) for n, t, *_ in before]
    for (name, _, old, version, rg, cls), (_, _, new, new_version, new_rg, new_cls) in zip(before, after):
        assert np.array_equal(old, new), name
        assert (new_version, new_rg, new_cls) == (version, rg, cls), name


def _new_state(model) -> dict:
    return {k: v + 1 if v.dtype.is_floating_point else v + 1 for k, v in model.state_dict().items()}


@pytest.mark.parametrize("exception", [ValueError, RuntimeError, KeyboardInterrupt, SystemExit, GeneratorExit])
@pytest.mark.parametrize("assign", [False, True])
def test_an_exception_from_a_load_pre_hook_midway_changes_nothing(exception, assign):
    model = _model()
    state = _new_state(model)
    before = _observe(model)

    def hook(module, *args):
        raise exception("interrupted while loading")

    model[2].register_load_state_dict_pre_hook(hook)  # after Linear 0 and BatchNorm 1 were loaded
    with pytest.raises(exception, match="interrupted"):
        model.load_state_dict(state, assign=assign)
    _assert_unchanged(model, before)


def test_an_exception_from_a_post_hook_changes_nothing():
    model = _model()
    before = _observe(model)
    model.register_load_state_dict_post_hook(lambda module, keys: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        model.load_state_dict(_new_state(model))
    _assert_unchanged(model, before)


@pytest.mark.parametrize("problem", ["size mismatch", "missing key", "not a tensor"])
def test_a_failed_load_keeps_the_recorded_graph_usable(problem):
    model = _model()
    x = runtime.randn(5, 3, requires_grad=True)
    loss = (model(x) ** 2).sum()  # Linear 0 and 2 save their weights for the backward
    state = _new_state(model)
    if problem == "size mismatch":
        state["2.weight"] = runtime.zeros(7, 7)
    elif problem == "missing key":
        del state["2.bias"]
    else:
        state["2.weight"] = [[0.0] * 4] * 2
    before = _observe(model)
    with pytest.raises(RuntimeError, match="Error\\(s\\) in loading state_dict"):
        model.load_state_dict(state)
    _assert_unchanged(model, before)
    loss.backward()  # used to raise the in-place error: the versions stayed bumped
    reference = _model()
    xr = runtime.from_numpy(x.detach().numpy().copy()).requires_grad_(True)
    (reference(xr) ** 2).sum().backward()
    assert np.allclose(x.grad.numpy(), xr.grad.numpy())
    assert np.allclose(model[0].weight.grad.numpy(), reference[0].weight.grad.numpy())


def test_versions_restore_through_views():
    model = _model()
    weight_t = model[0].weight.t()  # a view sharing the weight's version counter
    version = weight_t._version
    state = _new_state(model)
    state["2.weight"] = runtime.zeros(7, 7)
    with pytest.raises(RuntimeError):
        model.load_state_dict(state)
    assert weight_t._version == version and model[0].weight._version == version


def test_a_successful_load_still_bumps_versions():
    model = _model()
    versions = [p._version for p in model.parameters()]
    model.load_state_dict(_new_state(model))
    assert all(p._version > v for p, v in zip(model.parameters(), versions))
