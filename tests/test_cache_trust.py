"""The kernel cache runs nothing another user could have planted (docs/security.md, "The kernel cache").

A planted `__pycache__/k_*.pyc` is never imported; a planted numba index (.nbi, a pickle) in a directory others can
write is never read; such a directory, or one another user owns, is refused with a warning and compiling still
gives eager's results; the directories nnc makes are 0700. Where numba's cache state matters the tests run fresh
processes with NNC_CACHE_DIR in tmp_path.
"""
import importlib.util
import json
import marshal
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import cache
from runtime import nn

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")

# compiles a small MLP and compares it with eager; prints the warnings it saw and where its kernels live
_CHILD = r"""
import json, warnings
import numpy as np
import nnc, runtime
from runtime import nn

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    x = runtime.randn(4, 6)
    compiled = nnc.compile(model)
    with runtime.no_grad():
        got, want = compiled(x).numpy(), model(x).numpy()
print(json.dumps({"ok": bool(np.allclose(got, want, rtol=1e-5, atol=1e-6)),
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""


def _run_child(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "NUMBA_CACHE_DIR")}
    env.update(env_extra)
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


class _Payload:
    """Unpickling it appends to the marker file: what a planted pickle would run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'a').write('unpickled ')",)


def _plant_indexes(directory: Path, marker: Path) -> int:
    """Replace every numba index under `directory` with a malicious pickle; returns how many."""
    indexes = sorted(directory.rglob("*.nbi"))
    for index in indexes:
        index.write_bytes(pickle.dumps(_Payload(marker)))
    return len(indexes)


def _compile_and_compare(width: int = 5):
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, 4), nn.Tanh(), nn.Linear(4, 2))
    x = runtime.randn(3, width)
    compiled = nnc.compile(model)
    with runtime.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_planted_pyc_with_a_matching_header_never_runs(tmp_path):
    kernels, marker = tmp_path / "kernels", tmp_path / "marker"
    first = _run_child({"NNC_CACHE_DIR": str(kernels)})
    assert first["ok"], first
    sources = sorted(kernels.glob("k_*.py"))
    assert sources
    for source in sources:  # what Python's import would accept for this .py: same mtime and size in the header
        st = source.stat()
        code = compile(f"open({str(marker)!r}, 'a').write('pyc ')\n" + source.read_text(), str(source), "exec")
        header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
            (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
        pyc = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
        pyc.parent.mkdir(exist_ok=True)
        pyc.write_bytes(header + marshal.dumps(code))
    second = _run_child({"NNC_CACHE_DIR": str(kernels)})
    assert not marker.exists(), marker.read_text()
    assert second["ok"] and second["warnings"] == [], second


@pytest.mark.parametrize("mode, who", [(0o777, "its group and others"), (0o770, "its group")],
                         ids=["world-writable", "group-writable"])
def test_a_planted_index_in_a_shared_cache_directory_is_never_read(tmp_path, mode, who):
    kernels, marker = tmp_path / "kernels", tmp_path / "marker"
    assert _run_child({"NNC_CACHE_DIR": str(kernels)})["ok"]
    kernels.chmod(mode)  # as a shared directory would be: anyone in it could have written these
    assert _plant_indexes(kernels, marker)
    second = _run_child({"NNC_CACHE_DIR": str(kernels)})
    assert not marker.exists(), marker.read_text()
    assert second["ok"], second
    (warning,) = second["warnings"]
    assert warning.startswith("KernelCacheWarning") and str(kernels) in warning and f"writable by {who}" in warning


def test_a_planted_index_in_a_shared_numba_cache_dir_is_never_read(tmp_path):
    kernels, numba_dir, marker = tmp_path / "kernels", tmp_path / "numba", tmp_path / "marker"
    env = {"NNC_CACHE_DIR": str(kernels), "NUMBA_CACHE_DIR": str(numba_dir)}  # numba's cache goes there, not kernels/
    assert _run_child(env)["ok"]
    numba_dir.chmod(0o777)
    assert _plant_indexes(numba_dir, marker)
    second = _run_child(env)
    assert not marker.exists(), marker.read_text()
    assert second["ok"], second
    assert second["warnings"] and all(str(numba_dir) in w and "writable by" in w for w in second["warnings"]), second


def test_the_directories_nnc_makes_are_private_whatever_the_umask(monkeypatch, tmp_path):
    kernels = tmp_path / "a" / "b" / "kernels"
    monkeypatch.setenv(cache.ENV_VAR, str(kernels))
    old = os.umask(0o002)
    try:
        assert cache.cache_dir() == kernels
    finally:
        os.umask(old)
    for made in (tmp_path / "a", tmp_path / "a" / "b", kernels, kernels / "__pycache__"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made


@pytest.mark.parametrize("mode, problem", [(0o775, "writable by its group (mode 0775)"),
                                           (0o757, "writable by others (mode 0757)")])
def test_a_writable_cache_directory_is_refused_and_compiling_still_works(monkeypatch, tmp_path, mode, problem):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    kernels.chmod(mode)
    monkeypatch.setenv(cache.ENV_VAR, str(kernels))
    with pytest.warns(cache.KernelCacheWarning, match="not using the kernel cache directory") as caught:
        _compile_and_compare()
    message = str(caught[0].message)
    assert str(kernels) in message and problem in message
    assert not list(kernels.iterdir())  # nothing was written there either


def test_a_cache_directory_of_another_user_is_refused(monkeypatch, tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir(mode=0o700)
    other = os.getuid() + 4242
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):  # as if another user had made it (chown needs privileges tests lack)
        st = real_lstat(path, *args, **kwargs)
        if os.fspath(path) != str(kernels):
            return st
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, other, st.st_gid, st.st_size,
                               int(st.st_atime), int(st.st_mtime), int(st.st_ctime)))

    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setenv(cache.ENV_VAR, str(kernels))
    with pytest.warns(cache.KernelCacheWarning, match=f"{kernels}: .* owned by uid {other}, not by this user"):
        _compile_and_compare(width=6)
    assert not list(kernels.iterdir())


def test_a_directory_others_could_replace_is_refused_unless_sticky(monkeypatch, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(cache.ENV_VAR, str(shared / "kernels"))
    with pytest.warns(cache.KernelCacheWarning, match="shared is writable by .* not sticky"):
        assert cache.cache_dir() != shared / "kernels"
    shared.chmod(0o1777)  # like /tmp: no one can rename or replace another user's entry
    assert cache.cache_dir() == shared / "kernels"


def test_a_symlinked_pycache_is_refused(monkeypatch, tmp_path):
    kernels, elsewhere = tmp_path / "kernels", tmp_path / "elsewhere"
    kernels.mkdir(mode=0o700)
    elsewhere.mkdir(mode=0o700)
    (kernels / "__pycache__").symlink_to(elsewhere)  # numba would follow it wherever it points
    monkeypatch.setenv(cache.ENV_VAR, str(kernels))
    with pytest.warns(cache.KernelCacheWarning, match="__pycache__ is a symbolic link"):
        assert cache.cache_dir() != kernels
