"""save/load (runtime's format and torch.save zips) and safetensors, with torch and safetensors as oracles."""
from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict

import numpy as np
import pytest

import runtime
from runtime.serialization import _save_runtime, load, load_safetensors, save, save_safetensors

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
STRUCTURE = "runtime_save/structure.json"


@pytest.fixture
def st_numpy():
    return pytest.importorskip("safetensors.numpy")


def sample_tensors():
    """One tensor of each runtime dtype, plus 0-d and empty ones."""
    rng = np.random.default_rng(0)
    return {"f32": runtime.from_numpy(rng.standard_normal((3, 4)).astype(np.float32)),
            "f64": runtime.from_numpy(rng.standard_normal(5)),
            "f16": runtime.from_numpy(rng.standard_normal((2, 2)).astype(np.float16)),
            "bf16": runtime.from_numpy(rng.standard_normal((2, 3)).astype(np.float32)).bfloat16(),
            "i32": runtime.tensor([[1, -2], [3, 2**31 - 1]], dtype=runtime.int32),
            "i64": runtime.tensor([2**62, -5]),
            "i16": runtime.tensor([-(2**15), 2**15 - 1], dtype=runtime.int16),
            "i8": runtime.tensor([[-128], [127]], dtype=runtime.int8),
            "u8": runtime.tensor([0, 7, 255], dtype=runtime.uint8),
            "bool": runtime.tensor([True, False, True]),
            "scalar": runtime.tensor(2.5),
            "empty": runtime.zeros(0, 3)}


def describe(obj):
    """A comparable form of a loaded tree: container and scalar types, tensor dtypes, shapes and values."""
    if isinstance(obj, runtime.Tensor):
        return ("tensor", obj.dtype.name, tuple(obj.shape), obj.detach().numpy().tolist(), obj.requires_grad)
    if isinstance(obj, dict):
        return (type(obj).__name__, [(describe(k), describe(v)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [describe(v) for v in obj])
    return (type(obj).__name__, obj)


def round_trip(obj):
    buffer = io.BytesIO()
    save(obj, buffer)
    buffer.seek(0)
    return load(buffer)


def saved_bytes(obj, writer=None) -> bytes:
    """obj as runtime.save writes it (torch's format where it can), or with another writer (_save_runtime)."""
    buffer = io.BytesIO()
    (writer or save)(obj, buffer)
    return buffer.getvalue()


def runtime_format_bytes(obj) -> bytes:
    return saved_bytes(obj, _save_runtime)


def rewrite_zip(data: bytes, replace: dict) -> bytes:
    """The zip archive `data` with some entries' contents replaced (by name -> new bytes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, replace.get(info.filename, src.read(info.filename)))
    return out.getvalue()


# ------------------------------------------------------------------------------------------------
# runtime's own format
# ------------------------------------------------------------------------------------------------

def test_round_trip_keeps_values_types_and_structure():
    obj = {"tensors": sample_tensors(),
           "plain": {"int": 3, "float": 0.1, "big": 2**70, "inf": float("inf"), "bool": True, "none": None,
                     "str": "héllo"},
           "seq": [1, (2.0, [False, "x"]), ()],
           7: {0: "int keys stay ints", "0": "and str keys stay str"}}
    loaded = round_trip(obj)
    assert describe(loaded) == describe(obj)
    assert isinstance(loaded["seq"][1], tuple) and isinstance(loaded["seq"][1][1], list)
    assert loaded[7][0] == "int keys stay ints" and loaded[7]["0"] == "and str keys stay str"


def test_optimizer_state_dict_round_trip():
    state = {"state": {0: {"step": runtime.tensor(3.0), "exp_avg": runtime.ones(2, 3)},
                       1: {"step": runtime.tensor(3.0), "exp_avg": runtime.zeros(3)}},
             "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-08, "amsgrad": False,
                               "foreach": None, "params": [0, 1]}]}
    loaded = round_trip(state)
    assert describe(loaded) == describe(state)
    assert set(loaded["state"]) == {0, 1}
    assert loaded["param_groups"][0]["betas"] == (0.9, 0.999)


def test_ordered_dict_keeps_order_and_metadata():
    sd = OrderedDict([("z.weight", runtime.ones(2)), ("a.bias", runtime.zeros(1))])
    sd._metadata = OrderedDict([("", {"version": 1}), ("z", {"version": 2})])
    plain = OrderedDict(b=1)
    loaded = round_trip({"model": sd, "plain": plain})
    assert type(loaded["model"]) is OrderedDict and list(loaded["model"]) == ["z.weight", "a.bias"]
    assert loaded["model"]._metadata == {"": {"version": 1}, "z": {"version": 2}}
    assert not hasattr(loaded["plain"], "_metadata")


def test_shared_tensors_and_views_stay_shared():
    x = runtime.arange(12.0).reshape(3, 4)
    obj = {"a": x, "again": x, "nested": [x], "row": x[1], "col": x[:, 2]}
    for data, prefix in ((saved_bytes(obj), "archive/data/"), (runtime_format_bytes(obj), "runtime_save/storages/")):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            assert len([n for n in archive.namelist() if n.startswith(prefix)]) == 1
    loaded = load(io.BytesIO(data))
    assert loaded["a"] is loaded["again"] is loaded["nested"][0]
    loaded["a"][1, 2] = 100.0
    assert loaded["row"].tolist() == [4.0, 5.0, 100.0, 7.0]
    assert loaded["col"].tolist() == [2.0, 100.0, 10.0]
    assert x[1, 2].item() == 6.0  # the original is untouched


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_])
def test_numpy_arrays_load_back_as_numpy_arrays(dtype, tmp_path):
    """A data script's torch.save(array, ...): values, dtype, layout and sharing come back, as a numpy array."""
    base = (np.arange(24).reshape(4, 6) % 5).astype(dtype)
    saved = {"a": base, "again": base, "cols": base.T[1:, ::2], "zero_d": np.array(base[0, 1]),
             "tensor": runtime.ones(2)}
    save(saved, tmp_path / "data.pt")
    back = load(tmp_path / "data.pt")
    for key in ("a", "cols", "zero_d"):
        assert type(back[key]) is np.ndarray and back[key].dtype == base.dtype
        np.testing.assert_array_equal(back[key], saved[key])
    assert back["again"] is back["a"] and isinstance(back["tensor"], runtime.Tensor)
    back["a"][0, 1] = 1 - back["a"][0, 1]  # cols views a's memory, as the saved view did
    assert back["cols"][0, 0] == back["a"][0, 1]


def test_an_unsupported_numpy_array_is_a_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(TypeError, match=r"numpy array at obj\['names'\].*unsupported numpy dtype <U"):
        save({"names": np.array(["a", "b"])}, tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_unusual_layouts_round_trip():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    obj = {"transposed": runtime.from_numpy(base).t(),
           "stepped": runtime.from_numpy(base[1:, ::2]),
           "reversed": runtime.from_numpy(base[::-1, ::-2]),
           "broadcast": runtime.from_numpy(np.broadcast_to(np.arange(3.0), (4, 3))),
           "fortran": runtime.from_numpy(np.asfortranarray(base))}
    loaded = round_trip(obj)
    for key, t in obj.items():
        np.testing.assert_array_equal(loaded[key].numpy(), t.numpy(), err_msg=key)
        assert loaded[key].dtype is t.dtype


def test_loaded_tensors_are_writable_and_keep_requires_grad():
    w = runtime.randn(3, requires_grad=True)
    loaded = round_trip({"w": w, "count": runtime.tensor([1, 2])})
    assert loaded["w"].requires_grad and loaded["w"].is_leaf
    assert not loaded["count"].requires_grad
    loaded["count"].add_(1)
    assert loaded["count"].tolist() == [2, 3]
    (loaded["w"] * 2).sum().backward()
    assert loaded["w"].grad.tolist() == [2.0, 2.0, 2.0]


class _Unseekable(io.RawIOBase):
    def __init__(self, data: bytes):
        self._stream = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, b):
        return self._stream.readinto(b)


def test_paths_and_file_objects(tmp_path):
    obj = {"w": runtime.ones(2, 2)}
    save(obj, str(tmp_path / "a.pt"))
    save(obj, tmp_path / "b.pt")
    with open(tmp_path / "c.pt", "wb") as handle:
        save(obj, handle)
    with open(tmp_path / "c.pt", "rb") as handle:
        from_handle = load(handle)
    for loaded in (load(tmp_path / "a.pt"), load(str(tmp_path / "b.pt")), from_handle,
                   load(_Unseekable((tmp_path / "a.pt").read_bytes()))):
        assert describe(loaded) == describe(obj)


def test_saving_is_deterministic():
    """Equal objects saved independently give the same bytes, and so does saving what loading gave back: the
    archive holds no timestamps, object ids or other per-save state."""
    def make():
        return {"w": runtime.arange(6.0), "meta": {"epoch": 3}, "shared": [runtime.ones(2)] * 2}

    first = saved_bytes(make())
    assert saved_bytes(make()) == first
    assert saved_bytes(load(io.BytesIO(first))) == first
    with zipfile.ZipFile(io.BytesIO(first)) as archive:
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_large_tensors_save_their_values_without_the_alignment_padding():
    """Factories start large tensors on a cache line inside a padded allocation; a save writes the values only (the
    padding is uninitialised memory), so the bytes equal those of the same values in a plain numpy array."""
    aligned = runtime.full((50000,), 1.5)
    assert aligned.numpy().ctypes.data % 64 == 0
    plain = runtime.from_numpy(np.full((50000,), 1.5, dtype=np.float32))
    assert saved_bytes({"w": aligned, "row": aligned[10:20]}) == saved_bytes({"w": plain, "row": plain[10:20]})
    loaded = load(io.BytesIO(saved_bytes({"w": aligned, "row": aligned[10:20]})))
    loaded["w"][12] = 7.0
    assert loaded["row"][2].item() == 7.0  # the view still shares the saved tensor's storage


def test_unsupported_values_name_their_location(tmp_path):
    path = tmp_path / "never.pt"
    with pytest.raises(TypeError, match=r"set at obj\['state'\]\[0\]\['ids'\]"):
        save({"state": {0: {"ids": {1, 2}}}}, path)
    with pytest.raises(TypeError, match="dict key"):
        _save_runtime({(1, 2): runtime.ones(1)}, path)
    assert not path.exists()  # nothing is written when the object cannot be saved
    assert round_trip({(1, 2): runtime.ones(1)})[(1, 2)].tolist() == [1.0]  # torch's format takes any key


def test_reference_cycles_round_trip_in_torchs_format_and_are_refused_in_runtimes():
    cycle = {"a": []}
    cycle["a"].append(cycle)
    loaded = round_trip(cycle)
    assert loaded["a"][0] is loaded
    with pytest.raises(ValueError, match="reference cycle"):
        _save_runtime(cycle, io.BytesIO())


@pytest.mark.parametrize("keep", [0, 10, 0.5, -1])
def test_truncated_file_is_a_clear_error(tmp_path, keep):
    data = saved_bytes({"w": runtime.randn(64, 64)})
    size = int(len(data) * keep) if isinstance(keep, float) else (keep if keep >= 0 else len(data) + keep)
    path = tmp_path / "cut.pt"
    path.write_bytes(data[:size])
    with pytest.raises(RuntimeError, match=r"runtime.load: '.*cut.pt' (is empty|starts like a zip)"):
        load(path)


def test_corrupted_storage_bytes_are_detected(tmp_path):
    weights = runtime.from_numpy(np.arange(256, dtype=np.float32))
    data = bytearray(saved_bytes({"w": weights}))
    where = bytes(data).find(weights.numpy().tobytes())
    data[where + 100] ^= 0xFF
    path = tmp_path / "flipped.pt"
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"flipped.pt' is corrupted or truncated .*CRC"):
        load(path)


class _Evil:
    """Pickles as a call of `function(*args)`: what a malicious file would run on a plain unpickler."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return (self.function, self.args)


def test_foreign_files_are_refused_without_running_them(tmp_path):
    sentinel = tmp_path / "pwned"
    cases = {"notes.txt": (b"just some text", "not a zip archive"),
             "raw.pkl": (pickle.dumps(_Evil(os.system, f"touch {sentinel}"), protocol=2), "raw pickle"),
             "array.npy": (b"\x93NUMPY\x01\x00" + b"x" * 40, "not a zip archive")}
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(RuntimeError, match=message):
            load(tmp_path / name)
    save_safetensors({"w": runtime.ones(2)}, tmp_path / "w.safetensors")
    with pytest.raises(RuntimeError, match="load_safetensors"):
        load(tmp_path / "w.safetensors")
    other_zip = io.BytesIO()
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(RuntimeError, match="neither a runtime.save file nor a torch.save file"):
        load(io.BytesIO(other_zip.getvalue()))
    assert not sentinel.exists()


def _tamper(structure: dict, change: str) -> None:
    record = structure["tensors"][0]
    if change == "offset":
        record["offset"] = 10_000
    elif change == "stride":
        record["strides"] = [4, 400]
    elif change == "storage":
        record["storage"] = 5
    elif change == "dtype":
        record["dtype"] = "complex32"
    elif change == "tag":
        structure["object"] = {"set": [1, 2]}
    elif change == "tensor_ref":
        structure["object"] = {"dict": [["w", {"tensor": 3}]]}
    elif change == "version":
        structure["version"] = 99
    elif change == "format":
        structure["format"] = "something.else"


@pytest.mark.parametrize("change, message", [
    ("offset", "reach bytes"), ("stride", "reach bytes"), ("storage", "storage 5 does not exist"),
    ("dtype", "unknown dtype"), ("tag", "unrecognised value"), ("tensor_ref", "refers to tensor 3"),
    ("version", "format version 99"), ("format", "does not describe a runtime.save file")])
def test_tampered_structure_is_refused(change, message):
    data = runtime_format_bytes({"w": runtime.ones(2, 3)})
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        structure = json.loads(archive.read(STRUCTURE))
    _tamper(structure, change)
    tampered = rewrite_zip(data, {STRUCTURE: json.dumps(structure).encode()})
    with pytest.raises(RuntimeError, match=message):
        load(io.BytesIO(tampered))


def test_storage_of_the_wrong_size_is_refused():
    data = runtime_format_bytes({"w": runtime.ones(4)})
    tampered = rewrite_zip(data, {"runtime_save/storages/0": b"\x00" * 8})
    with pytest.raises(RuntimeError, match="of 8 bytes, but its tensors need 16"):
        load(io.BytesIO(tampered))


def test_map_location_and_weights_only():
    data = saved_bytes({"w": runtime.ones(2)})
    for map_location in (None, "cpu", runtime.device("cpu"), {"cuda:0": "cpu"}, lambda storage, loc: storage):
        loaded = load(io.BytesIO(data), map_location=map_location, weights_only=False)
        assert loaded["w"].tolist() == [1.0, 1.0]
    for map_location in ("cuda", "cuda:0", {"cpu": "cuda:1"}):
        with pytest.raises(RuntimeError, match=r"map_location=.*cuda"):
            load(io.BytesIO(data), map_location=map_location)


def test_text_stream_is_a_type_error():
    with pytest.raises(TypeError, match="binary file object"):
        load(io.StringIO("text"))


# ------------------------------------------------------------------------------------------------
# torch.save's zip format, read without torch
# ------------------------------------------------------------------------------------------------

def _torch_zip(pickled: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
    return out.getvalue()


@pytest.mark.parametrize("payload", ["os.system", "builtins.eval", "builtins.getattr"])
def test_malicious_torch_pickle_is_refused(tmp_path, payload):
    sentinel = tmp_path / "pwned"
    evil = {"os.system": _Evil(os.system, f"touch {sentinel}"),
            "builtins.eval": _Evil(eval, f"open({str(sentinel)!r}, 'w')"),
            "builtins.getattr": _Evil(getattr, "text", "upper")}[payload]
    path = tmp_path / "evil.pt"
    path.write_bytes(_torch_zip(pickle.dumps({"w": evil}, protocol=2)))
    refused = r"evil.pt'.*refusing to load the global '\w+\.(system|eval|getattr)'"
    with pytest.raises(pickle.UnpicklingError, match=refused):
        load(path)
    assert not sentinel.exists()


def test_torch_pickle_with_bad_arguments_is_a_clear_error():
    class BadRebuild:
        def __reduce__(self):
            return (OrderedDict, ("not pairs",))

    with pytest.raises(RuntimeError, match=r"malformed archive/data.pkl \(ValueError"):
        load(io.BytesIO(_torch_zip(pickle.dumps({"w": BadRebuild()}, protocol=2))))


class TinyNet:
    """Builds a small torch model with parameters and buffers of several kinds."""

    @staticmethod
    def make(torch):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU(),
                                    torch.nn.Linear(3, 2, bias=False))
        model(torch.randn(5, 4))  # moves the batch-norm running statistics off their defaults
        return model


def assert_matches_torch(loaded, expected):
    assert loaded.dtype.name == str(expected.dtype).split(".")[-1]
    assert tuple(loaded.shape) == tuple(expected.shape)
    if loaded.dtype is runtime.bfloat16:  # torch has no numpy bfloat16: compare the exact float32 values and bits
        np.testing.assert_array_equal(loaded.detach().float().numpy(), expected.detach().float().numpy())
        assert loaded.detach().numpy().view(np.int16).tolist() == expected.detach().view(torch_int16()).tolist()
        return
    np.testing.assert_array_equal(loaded.detach().numpy(), expected.detach().numpy())


def torch_int16():
    import torch

    return torch.int16


def test_torch_state_dict_loads(tmp_path, torch):
    sd = TinyNet.make(torch).state_dict()
    torch.save(sd, tmp_path / "model.pt")
    loaded = load(tmp_path / "model.pt", map_location="cpu")
    assert type(loaded) is OrderedDict and list(loaded) == list(sd)
    assert loaded._metadata == sd._metadata
    for key, value in sd.items():
        assert isinstance(loaded[key], runtime.Tensor)
        assert_matches_torch(loaded[key], value)
    assert loaded["1.num_batches_tracked"].dtype is runtime.int64


def test_torch_file_loads_with_torch_unimportable(tmp_path, torch):
    sd = TinyNet.make(torch).state_dict()
    torch.save(sd, tmp_path / "model.pt")
    script = ("import sys, json\n"
              "sys.modules['torch'] = None; sys.modules['safetensors'] = None  # any import of them fails\n"
              "from runtime.serialization import load\n"
              "sd = load(sys.argv[1])\n"
              "print(json.dumps({k: [v.dtype.name, v.numpy().tolist()] for k, v in sd.items()}))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model.pt")], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert list(loaded) == list(sd)
    for key, value in sd.items():
        assert loaded[key] == [str(value.dtype).split(".")[-1], value.tolist()]


def test_torch_views_offsets_and_shared_storage(tmp_path, torch):
    x = torch.arange(24.0).reshape(4, 6)
    obj = {"x": x, "x_again": x, "t": x.t(), "row": x[2], "stepped": x[1:, ::2], "tail": x.view(-1)[7:],
           "other": torch.ones(2)}
    torch.save(obj, tmp_path / "views.pt")
    loaded = load(tmp_path / "views.pt")
    for key, value in obj.items():
        assert_matches_torch(loaded[key], value)
        assert loaded[key].stride() == value.stride(), key
    assert loaded["x"] is loaded["x_again"]
    loaded["x"][2, 0] = -1.0  # views of one torch storage share memory after loading
    assert loaded["row"][0].item() == -1.0 and loaded["t"][0, 2].item() == -1.0
    assert not np.shares_memory(loaded["x"].numpy(), loaded["other"].numpy())


def test_torch_dtypes_and_shapes(tmp_path, torch):
    obj = {"f16": torch.randn(3).half(), "f32": torch.randn(2, 2), "f64": torch.randn(2).double(),
           "i32": torch.tensor([1, -7], dtype=torch.int32), "i64": torch.tensor([2**40]),
           "i16": torch.tensor([-(2**15), 300], dtype=torch.int16), "i8": torch.tensor([-128, 127], dtype=torch.int8),
           "u8": torch.arange(256, dtype=torch.uint8).reshape(16, 16)[::2, 1:], "u8_scalar": torch.tensor(200).byte(),
           "bf16": torch.randn(4, 3).bfloat16().t(),
           "bf16_special": torch.tensor([float("inf"), -0.0, 1e-40]).bfloat16(),
           "bool": torch.tensor([True, False]), "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 2)}
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    loaded = load(buffer)
    for key, value in obj.items():
        assert_matches_torch(loaded[key], value)


def test_torch_parameters_and_optimizer_state(tmp_path, torch):
    model = TinyNet.make(torch)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    torch.save({"param": model[0].weight, "optim": optimizer.state_dict()}, tmp_path / "ckpt.pt")
    loaded = load(tmp_path / "ckpt.pt")
    assert loaded["param"].requires_grad
    assert_matches_torch(loaded["param"], model[0].weight)
    expected = optimizer.state_dict()
    assert loaded["optim"]["param_groups"] == expected["param_groups"]
    assert set(loaded["optim"]["state"]) == set(expected["state"])
    for index, state in expected["state"].items():
        for name, value in state.items():
            assert_matches_torch(loaded["optim"]["state"][index][name], value)


@pytest.mark.parametrize("dtype_name", ["complex64", "complex128"])
def test_torch_complex_tensors_load(tmp_path, torch, dtype_name):
    value = torch.tensor([1 + 2j, -0.5j], dtype=getattr(torch, dtype_name))
    torch.save({"w": value}, tmp_path / "w.pt")
    loaded = load(tmp_path / "w.pt")["w"]
    assert loaded.dtype.name == dtype_name and loaded.numpy().tolist() == value.numpy().tolist()


def test_torch_global_outside_the_allowlist_is_refused(tmp_path, torch):
    torch.save({"shape": torch.Size([2, 3])}, tmp_path / "size.pt")
    with pytest.raises(pickle.UnpicklingError, match="refusing to load the global 'torch.Size'"):
        load(tmp_path / "size.pt")


def test_torch_big_endian_file(tmp_path, torch):
    obj = {"f": torch.arange(6.0).reshape(2, 3), "i": torch.tensor([1, 2**40]), "h": torch.tensor([0.5]).half()}
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    replace = {"archive/byteorder": b"big"}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for key, value in obj.items():
            stored = [n for n in archive.namelist() if n.startswith("archive/data/")]
            for name in stored:
                raw = archive.read(name)
                if raw == value.numpy().tobytes():
                    replace[name] = value.numpy().byteswap().tobytes()
    assert len(replace) == 4
    loaded = load(io.BytesIO(rewrite_zip(data, replace)))
    for key, value in obj.items():
        assert_matches_torch(loaded[key], value)


def test_torch_legacy_and_damaged_files(tmp_path, torch):
    torch.save({"w": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(RuntimeError, match="legacy"):
        load(tmp_path / "legacy.pt")
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(100.0)}, buffer)
    data = bytearray(buffer.getvalue())
    data[bytes(data).find(torch.arange(100.0).numpy().tobytes()) + 40] ^= 0xFF
    with pytest.raises(RuntimeError, match="corrupted or truncated"):
        load(io.BytesIO(bytes(data)))
    with pytest.raises(RuntimeError, match="starts like a zip"):
        load(io.BytesIO(buffer.getvalue()[: len(data) // 2]))


# ------------------------------------------------------------------------------------------------
# safetensors
# ------------------------------------------------------------------------------------------------

def safetensors_bytes(header: dict, buffer: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + buffer


def test_safetensors_round_trip_and_layout(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "all.safetensors"
    save_safetensors(tensors, path, metadata={"format": "pt", "note": "ok"})
    data = path.read_bytes()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_size])
    assert header_size % 8 == 0 and header["__metadata__"] == {"format": "pt", "note": "ok"}
    assert header["f64"] == {"dtype": "F64", "shape": [5], "data_offsets": [0, 40]}
    loaded = load_safetensors(path)
    assert set(loaded) == set(tensors)
    for key, value in tensors.items():
        assert describe(loaded[key]) == describe(value)
    loaded["i64"].add_(1)  # loaded tensors are ordinary writable tensors
    assert loaded["i64"].tolist() == [2**62 + 1, -4]


def test_safetensors_non_contiguous_and_empty_dict(tmp_path):
    base = runtime.arange(12.0).reshape(3, 4)
    save_safetensors({"t": base.t(), "stepped": base[:, ::2]}, tmp_path / "v.safetensors")
    loaded = load_safetensors(tmp_path / "v.safetensors")
    assert loaded["t"].tolist() == base.t().tolist() and loaded["stepped"].tolist() == base[:, ::2].tolist()
    save_safetensors({}, tmp_path / "empty.safetensors")
    assert load_safetensors(tmp_path / "empty.safetensors") == {}


def test_runtime_safetensors_read_by_the_package(tmp_path, st_numpy):
    from safetensors import safe_open

    tensors = sample_tensors()
    path = tmp_path / "rt.safetensors"
    save_safetensors(tensors, path, metadata={"source": "runtime"})
    arrays = st_numpy.load_file(str(path))
    for key, value in tensors.items():
        assert arrays[key].dtype == value.numpy().dtype
        np.testing.assert_array_equal(arrays[key], value.numpy())
    with safe_open(str(path), framework="numpy") as handle:
        assert handle.metadata() == {"source": "runtime"}


def test_package_safetensors_read_by_runtime(tmp_path, st_numpy):
    arrays = {name: t.numpy() for name, t in sample_tensors().items()}
    st_numpy.save_file(arrays, str(tmp_path / "np.safetensors"), metadata={"k": "v"})
    loaded = load_safetensors(tmp_path / "np.safetensors")
    assert set(loaded) == set(arrays)
    for key, array in arrays.items():
        assert loaded[key].dtype is runtime.dtypes.from_numpy_dtype(array.dtype)
        np.testing.assert_array_equal(loaded[key].numpy(), array)


def test_safetensors_torch_both_directions(tmp_path, torch):
    st_torch = pytest.importorskip("safetensors.torch")
    tensors = {"w": torch.randn(3, 4), "b": torch.randn(4).double(), "h": torch.randn(2).half(),
               "n": torch.tensor([1, 2], dtype=torch.int32), "m": torch.tensor([True]),
               "u8": torch.tensor([0, 255], dtype=torch.uint8), "i8": torch.tensor([-128, 5], dtype=torch.int8),
               "i16": torch.tensor([-(2**15), 9], dtype=torch.int16), "bf": torch.randn(5).bfloat16()}
    st_torch.save_file(tensors, str(tmp_path / "torch.safetensors"))
    loaded = load_safetensors(tmp_path / "torch.safetensors")
    for key, value in tensors.items():
        assert_matches_torch(loaded[key], value)
    save_safetensors(loaded, tmp_path / "back.safetensors")
    back = st_torch.load_file(str(tmp_path / "back.safetensors"))
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value)


F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, buffer, message", [
    ({"a": F32_2, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), "overlapping tensors"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), r"bytes \[0, 4\) .* no tensor uses"),
    ({"a": F32_2}, bytes(12), "4 trailing bytes"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), "span 8 bytes"),
    ({"a": F32_2}, bytes(4), "beyond the 4-byte data buffer"),
    ({"a": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, bytes(4), "dtype 'F8_E4M3'"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8), "malformed"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8), "malformed"),
    ({"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, bytes(8), "malformed"),
    ({"__metadata__": {"k": 1}, "a": F32_2}, bytes(8), "__metadata__"),
])
def test_safetensors_bad_headers(tmp_path, header, buffer, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(safetensors_bytes(header, buffer))
    with pytest.raises(RuntimeError, match=message):
        load_safetensors(path)


@pytest.mark.parametrize("content, message", [
    (b"\x01\x02", "too short"),
    (struct.pack("<Q", 1000) + b"{}", "declares a 1000-byte header"),
    (struct.pack("<Q", 4) + b"{no}", "not valid JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
])
def test_safetensors_damaged_files(tmp_path, content, message):
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(content)
    with pytest.raises(RuntimeError, match=rf"load_safetensors: '.*damaged.safetensors' .*{message}"):
        load_safetensors(path)


def test_save_safetensors_argument_errors(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(ValueError, match="names must be strings"):
        save_safetensors({1: runtime.ones(1)}, path)
    with pytest.raises(ValueError, match="__metadata__"):
        save_safetensors({"__metadata__": runtime.ones(1)}, path)
    with pytest.raises(TypeError, match="not a tensor"):
        save_safetensors({"w": [1.0]}, path)
    with pytest.raises(TypeError, match="metadata must be a dict of str -> str"):
        save_safetensors({"w": runtime.ones(1)}, path, metadata={"epoch": 3})
    assert not path.exists()


def test_runtime_save_files_load_in_torch(tmp_path, torch):
    """runtime.save writes torch.save's zip format, so real torch.load(weights_only=True) reads a checkpoint made
    here: a model's state_dict (with its _metadata), an optimizer's, parameters, views sharing one storage, and
    every dtype; runtime.load reads the same file back with the same sharing."""
    model = runtime.nn.Sequential(runtime.nn.Linear(3, 4), runtime.nn.BatchNorm1d(4))
    optimizer = runtime.optim.AdamW(model.parameters(), lr=0.01)
    model(runtime.randn(5, 3)).sum().backward()
    optimizer.step()
    base = runtime.arange(24.0).reshape(4, 6)
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3,
                  "weight": model[0].weight, "rows": base[1:3, ::2], "columns": base.T, "base": base,
                  **{f"t_{k}": v for k, v in sample_tensors().items()},
                  "complex": runtime.tensor([1 + 2j, -3j], dtype=runtime.complex64)}
    save(checkpoint, tmp_path / "ckpt.pt")
    theirs = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert type(theirs["model"]) is type(checkpoint["model"]) and list(theirs["model"]) == list(checkpoint["model"])
    assert theirs["model"]._metadata == checkpoint["model"]._metadata
    assert isinstance(theirs["weight"], torch.nn.Parameter) and theirs["epoch"] == 3
    assert theirs["rows"].untyped_storage().data_ptr() == theirs["base"].untyped_storage().data_ptr()
    for key, value in checkpoint.items():
        if isinstance(value, runtime.Tensor):
            assert str(theirs[key].dtype).removeprefix("torch.") == value.dtype.name
            np.testing.assert_array_equal(theirs[key].detach().float().numpy() if value.dtype is runtime.bfloat16
                                          else theirs[key].detach().numpy(), value.detach().float().numpy()
                                          if value.dtype is runtime.bfloat16 else value.detach().numpy())
    assert theirs["optimizer"]["param_groups"][0]["lr"] == 0.01
    ours = load(tmp_path / "ckpt.pt")
    assert describe(ours["optimizer"]) == describe(checkpoint["optimizer"])
    assert isinstance(ours["weight"], runtime.nn.Parameter) and ours["weight"].requires_grad
    assert np.shares_memory(ours["rows"].numpy(), ours["base"].numpy())
