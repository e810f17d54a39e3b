"""CUDA in the main run (no simulator, no GPU here): the device queries, clear errors for CUDA tensors, and every
kind of eager CUDA kernel compiled to PTX by numba-cuda's real compiler (no GPU needed), so code the simulator would
accept but the compiler rejects is caught. The CUDA tensors themselves are tested in tests/cuda (the simulator)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import runtime
from runtime import dtypes as dt
from runtime import nn
from runtime.ops import OPS, Kind

numba_cuda = pytest.importorskip("numba.cuda", reason="numba-cuda (the `cuda` extra) is not installed")
HAS_GPU = numba_cuda.is_available()
no_gpu = pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: CUDA tensors are available")


def test_is_available_follows_numba_cuda():
    assert runtime.cuda.is_available() is HAS_GPU
    assert runtime.cuda.device_count() == (len(numba_cuda.gpus) if HAS_GPU else 0)
    runtime.cuda.synchronize()


def test_manual_seed_seeds_the_cuda_generator_too():
    runtime.manual_seed(123)
    assert runtime.cuda.default_generator.initial_seed() == 123
    runtime.cuda.manual_seed(7)
    assert runtime.cuda.default_generator.initial_seed() == 7 and runtime.random.default_generator.initial_seed() == 123


@no_gpu
def test_cuda_tensors_give_a_clear_error_without_cuda():
    x = runtime.zeros(2)
    for make in (lambda: runtime.zeros(2, device="cuda"), lambda: runtime.tensor([1.0], device="cuda:0"),
                 lambda: x.cuda(), lambda: x.to("cuda"), lambda: x.to(device=runtime.device("cuda")),
                 lambda: nn.Linear(2, 2).cuda(), lambda: nn.Linear(2, 2).to("cuda")):
        with pytest.raises(RuntimeError, match=r"is_available\(\) is False.*NUMBA_ENABLE_CUDASIM"):
            make()
    with pytest.raises(RuntimeError, match="no CUDA"):
        runtime.cuda.current_device()
    assert x.device == runtime.device("cpu") and not x.is_cuda and x.get_device() == -1
    assert x.to("cpu") is x and x.cpu() is x


def test_device_strings_and_errors():
    assert runtime.device("cuda:0") == runtime.device("cuda", 0) == "cuda:0"
    assert runtime.device(0) == runtime.device("cuda:0") and str(runtime.device("cuda")) == "cuda"
    with pytest.raises(RuntimeError, match="Expected one of cpu, cuda, meta"):
        runtime.device("tpu")
    with pytest.raises(RuntimeError, match="not available"):
        runtime.zeros(2, device="meta")


def test_import_runtime_does_not_load_numba():
    code = "import sys, runtime; runtime.zeros(2).cpu(); print('numba' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------------------------
# the eager kernels, compiled to PTX for real GPUs
# ---------------------------------------------------------------------------------------------------------------

def _array(d, rank):
    import numba
    from numba import types

    return types.Array(numba.from_dtype(np.dtype(d)), rank, "A")


def _ptx(name, source, signature, cc=(8, 0)) -> str:
    from runtime.cuda import kernels

    scope = dict(kernels.KERNEL_GLOBALS)
    exec(compile(source, name, "exec"), scope)
    ptx, _ = numba_cuda.compile_ptx(scope[name], signature, cc=cc)
    assert f".target sm_{cc[0]}{cc[1]}" in ptx
    return ptx


def _elementwise_cases():
    """(op, operand dtypes, compute, out) for every template op, in float32 and the integer/bool dtypes it takes."""
    cases = []
    for name, op in sorted(OPS.items()):
        if op.kind != Kind.ELEMENTWISE or not op.template or name == "detach":
            continue
        for d in (dt.float32, dt.int64, dt.bool_):
            dtypes = [dt.bool_ if name == "where" and k == 0 else d for k in range(op.arity)]
            operands = [runtime.zeros(2, dtype=x) for x in dtypes]
            attrs = {"min": 0.0, "max": 1.0} if name == "clamp" else {"dtype": dt.float64} if name == "cast" else {}
            try:
                compute, out = op.dtype_rule(op, operands, attrs)
            except (RuntimeError, TypeError):
                continue  # this dtype is an error for this op (bool negation, float bitwise ops)
            cases.append((name, tuple(x.np for x in dtypes), compute and compute.np, out.np, attrs))
            if d is dt.float32 and name not in ("pow", "where", "cast", "clamp"):
                break  # one dtype is enough for ops whose spelling does not change with the dtype
    return cases


ELEMENTWISE_CASES = _elementwise_cases()


@pytest.mark.parametrize("name,dtypes,compute,out,attrs", ELEMENTWISE_CASES,
                         ids=[f"{c[0]}-{np.dtype(c[1][-1]).name}" for c in ELEMENTWISE_CASES])
def test_elementwise_kernels_compile_to_ptx(name, dtypes, compute, out, attrs):
    import numba
    from numba import types

    from runtime.cuda import kernels

    op = OPS[name]
    source = kernels.elementwise_source("k", op, list(dtypes), compute, out, 2, attrs)
    work = compute if compute is not None else out
    scalars = (numba.from_dtype(np.dtype(work)),) * 2 if name == "clamp" else ()
    _ptx("k", source, (_array(out, 2),) + tuple(_array(d, 2) for d in dtypes) + scalars + (types.int64,))


def test_every_template_op_is_compiled_above():
    # NOTE: the counter-based draws (needs_index: philox_*) exist only in compiled graphs; runtime's CUDA templates
    # have no spelling for them and say so (NoLowering) rather than draw without an element index
    templated = {n for n, op in OPS.items()
                 if op.kind == Kind.ELEMENTWISE and op.template and not op.needs_index} - {"detach"}
    assert templated == {c[0] for c in ELEMENTWISE_CASES}


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_reduction_matmul_and_gather_kernels_compile_to_ptx(cc):
    from numba import types

    from runtime.cuda import kernels

    for name, in_dtype, out in (("sum", np.float32, np.float32), ("amax", np.float64, np.float64),
                                ("any", np.bool_, np.bool_), ("prod", np.int64, np.int64)):
        reducer = OPS[name].reducer
        acc = reducer.accumulator(np.dtype(in_dtype), np.dtype(out))
        source = kernels.reduction_source("k", reducer, in_dtype, acc, out, 256)
        ptx = _ptx("k", source, (_array(out, 1), _array(in_dtype, 2)), cc)
        assert "bar.sync" in ptx  # the shared-memory tree synchronises its block
    source = kernels.arg_reduction_source("k", True, 256)
    _ptx("k", source, (_array(np.int64, 1), _array(np.float32, 2), _array(np.float32, 2)), cc)
    for d, acc in ((np.float32, np.float32), (np.int64, np.int64)):
        ptx = _ptx("k", kernels.matmul_source("k", acc, d, 16), (_array(d, 3),) * 3, cc)
        assert ".shared" in ptx
    for scatter in (False, True):
        source = kernels.gather_source("k", 2, 1, scatter)
        ptx = _ptx("k", source, (_array(np.float32, 2), _array(np.float32, 2), _array(np.int64, 2), types.int64), cc)
        assert ("atom" in ptx or "red." in ptx) == scatter


def test_window_kernels_compile_to_ptx():
    from numba import types

    from runtime.cuda import kernels

    attrs = {"kernel": (3, 2), "stride": (2, 1), "padding": ((1, 1), (0, 1)), "dilation": (1, 2)}
    sizes, i64, f4 = types.UniTuple(types.int64, 2), types.int64, np.float32
    _ptx("k", kernels.im2col_source("k", 2, attrs), (_array(f4, 2), _array(f4, 4), sizes, i64, i64))
    _ptx("k", kernels.col2im_source("k", 2, attrs), (_array(f4, 4), _array(f4, 2), sizes, i64, i64))
    _ptx("k", kernels.max_pool_source("k", 2, attrs, backward=False), (_array(f4, 4), _array(f4, 4), sizes, i64))
    ptx = _ptx("k", kernels.max_pool_source("k", 2, attrs, backward=True),
               (_array(f4, 4), _array(f4, 4), _array(f4, 4), sizes, i64))
    assert "atom" in ptx or "red." in ptx
    for op, combine in (("cumsum", "({0} + {1})"), ("cumprod", "({0} * {1})")):
        _ptx("k", kernels.scan_source("k", combine, np.int64), (_array(np.int64, 2), _array(np.int32, 2)))
    for mode in ("take", "put", "put_add"):
        _ptx("k", kernels.take_source("k", mode), (_array(f4, 3), _array(f4, 3), _array(np.int64, 1), i64, i64))
