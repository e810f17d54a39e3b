"""nnc.codegen.cache keeps a bounded number of imported kernel modules (an LRU); evicted ones come back from disk."""
import importlib
import sys
import warnings

import numpy as np
import pytest

import nnc
import runtime
from nnc.codegen import cache
from runtime import nn


def _compile_width(width: int):
    model = nn.Sequential(nn.Linear(width, width), nn.Tanh())
    compiled = nnc.compile(model)
    x = runtime.randn(2, width)
    with runtime.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    return compiled


def test_only_the_most_recent_modules_stay_imported(monkeypatch, tmp_path):
    monkeypatch.setenv("NNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NNC_KERNEL_MODULES", "2")
    cache.forget()
    first = _compile_width(3)
    (oldest,) = [m for m in cache._modules.values()][:1]
    for width in (4, 5):
        _compile_width(width)
    assert cache.loaded() == 2
    assert oldest.__name__ not in sys.modules  # dropped from the memo and from sys.modules
    x = runtime.randn(2, 3)
    with runtime.no_grad():  # a plan that still runs an evicted kernel keeps it alive and working
        np.testing.assert_allclose(first(x).numpy(), first._module(x).numpy(), rtol=1e-5, atol=1e-6)


def test_an_evicted_kernel_is_imported_again_from_the_disk_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("NNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NNC_KERNEL_MODULES", "1")
    cache.forget()
    source = "def f():\n    return 41\n"
    other = "def f():\n    return 42\n"
    module, path, again = cache.load_module(source)
    assert not again and module.f() == 41
    cache.load_module(other)
    reloaded, same_path, again = cache.load_module(source)
    assert not again and same_path == path and reloaded.f() == 41 and cache.loaded() == 1


def test_a_memo_hit_moves_a_module_to_the_recent_end(monkeypatch, tmp_path):
    monkeypatch.setenv("NNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NNC_KERNEL_MODULES", "2")
    cache.forget()
    a = cache.load_module("A = 1\n")[0]
    cache.load_module("B = 1\n")
    assert cache.load_module("A = 1\n")[2]  # a hit
    cache.load_module("C = 1\n")  # evicts B, the least recently used
    assert a.__name__ in sys.modules and cache.loaded() == 2
    assert cache.load_module("A = 1\n")[2] and not cache.load_module("B = 1\n")[2]


def test_a_bad_limit_falls_back_to_the_default(monkeypatch):
    monkeypatch.setenv("NNC_KERNEL_MODULES", "many")
    assert cache.module_limit() == cache.DEFAULT_MODULES
    monkeypatch.setenv("NNC_KERNEL_MODULES", "0")
    assert cache.module_limit() == 1


def test_a_whole_graph_with_more_kernels_than_the_limit_still_imports_them(monkeypatch, tmp_path):
    """run_graph imports its kernels' modules by name: they are re-imported and kept while it loads."""
    monkeypatch.setenv("NNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NNC_KERNEL_MODULES", "1")
    cache.forget()
    runtime.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.Sigmoid(), nn.Linear(6, 3))
    compiled = nnc.compile(model, whole_graph=True)
    x = runtime.randn(1, 6)
    with warnings.catch_warnings(), runtime.no_grad():
        warnings.simplefilter("error")  # a failed whole-graph import would warn and run kernel by kernel
        got = compiled(x)
    (artifact,) = compiled._cache.values()
    assert artifact.forward_plan.whole_graph and len(artifact.forward_plan.kernels) > 1
    np.testing.assert_allclose(got.numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_only_modules_this_process_generated_or_loaded_import_by_name(monkeypatch, tmp_path):
    """A kernel module imports its libraries by name; a file in the cache that this process never generated is not
    importable that way, whatever its name."""
    monkeypatch.setenv("NNC_CACHE_DIR", str(tmp_path))
    planted = "PLANTED = True\n"
    cache.write_source(planted)  # on disk under the name its text hashes to, never generated here
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(cache.module_name(planted))
    library = "VALUE = 7\n"
    name = cache.library(library)
    kernel, _, _ = cache.load_module(f"from {name} import VALUE\nDOUBLE = 2 * VALUE\n")
    assert kernel.DOUBLE == 14 and sys.modules[name] is cache.load_module(library)[0]


def test_kernels_of_other_shapes_share_one_compiled_block_helper(monkeypatch, tmp_path):
    """Two row sums of different lengths are two kernel modules, but one block_sum library: numba compiles it once."""
    monkeypatch.setenv("NNC_CACHE_DIR", str(tmp_path))
    helpers = []
    for width in (80, 96):
        model = nnc.compile(_RowSum(), whole_graph=False)
        x = runtime.randn(3, width)
        with runtime.no_grad():
            np.testing.assert_allclose(model(x).numpy(), x.numpy().sum(1), rtol=1e-5, atol=1e-5)
        (artifact,) = model._cache.values()
        (step,) = [s for p in artifact.plans for s in p.steps if hasattr(s, "compiled")]
        module = sys.modules[cache.module_name(step.compiled.path.read_text())]
        helpers.append(module.block_sum_float32)
    assert helpers[0] is helpers[1] and len(helpers[0].overloads) == 1


class _RowSum(nn.Module):
    def forward(self, x):
        return x.sum(1)


def test_a_source_another_process_wrote_meanwhile_is_kept_not_replaced(monkeypatch, tmp_path):
    """Two processes writing one kernel's source at once: the second keeps the first's file (same inode, same
    modification time), so the first's lock on it and numba's cache entry for it stay valid."""
    source = "x = 1\n"
    path = cache.write_source(source, tmp_path)
    before = path.stat()
    real_holds, looks = cache._holds, []

    def first_look_misses(p, s):  # the first look came before the other process's file appeared
        looks.append(p)
        return len(looks) > 1 and real_holds(p, s)

    monkeypatch.setattr(cache, "_holds", first_look_misses)
    assert cache.write_source(source, tmp_path) == path
    assert len(looks) == 2
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_a_torn_source_file_is_replaced(tmp_path):
    source = "x = 1\n"
    path = cache.source_path(source, tmp_path)
    path.write_text("x = ")
    assert cache.write_source(source, tmp_path) == path
    assert path.read_text() == source
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
