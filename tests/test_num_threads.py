"""runtime.set_num_threads / get_num_threads, as torch's: OpenBLAS's products and this thread's numba kernels run
on the count set; bad counts are torch's errors, and change nothing."""
import os

import numba
import numpy as np
import pytest

import runtime
from helpers import needs_torch
from runtime import threads
from runtime._openblas import thread_count_functions

BLAS = thread_count_functions()


@pytest.fixture(autouse=True)
def _restore_thread_counts():
    blas, kernels, requested = BLAS[0]() if BLAS else None, numba.get_num_threads(), threads._requested
    yield
    if BLAS:
        BLAS[1](blas)
    numba.set_num_threads(kernels)
    threads._requested = requested


def test_the_count_reaches_openblas_and_this_threads_numba_kernels():
    runtime.set_num_threads(1)
    assert runtime.get_num_threads() == 1 and numba.get_num_threads() == 1
    if BLAS:
        assert BLAS[0]() == 1
    runtime.set_num_threads(np.int64(numba.config.NUMBA_NUM_THREADS + 3))  # any integer; numba keeps its pool
    assert runtime.get_num_threads() == numba.config.NUMBA_NUM_THREADS + 3
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS


def test_before_any_set_the_count_is_openblas_or_the_cores():
    threads._requested = None
    assert runtime.get_num_threads() == (BLAS[0]() if BLAS else len(os.sched_getaffinity(0)))


def test_a_compiled_model_still_matches_eager_on_one_thread():
    import nnc

    runtime.manual_seed(0)
    model = runtime.nn.Sequential(runtime.nn.Linear(64, 256), runtime.nn.GELU(), runtime.nn.Linear(256, 8))
    x = runtime.randn(512, 64)
    compiled = nnc.compile(model)
    runtime.set_num_threads(1)
    with runtime.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


BAD = [0, -2, 1.5, "2", True]


@pytest.mark.parametrize("count", BAD, ids=repr)
def test_a_bad_count_is_an_error_that_changes_nothing(count):
    runtime.set_num_threads(1)
    with pytest.raises(RuntimeError, match="set_num_threads expects"):
        runtime.set_num_threads(count)
    assert runtime.get_num_threads() == 1 and numba.get_num_threads() == 1


@needs_torch
@pytest.mark.parametrize("count", BAD, ids=repr)
def test_bad_counts_are_torchs_errors(torch, count):
    with pytest.raises(RuntimeError) as theirs:
        torch.set_num_threads(count)
    with pytest.raises(RuntimeError) as ours:
        runtime.set_num_threads(count)
    assert str(ours.value) == str(theirs.value)
