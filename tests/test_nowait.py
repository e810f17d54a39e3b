"""nnc.codegen.nowait: the batch-1 product shared with a helper thread is bit-identical to the serial loop, whoever
computes which chunk, and a late helper never changes a result after the call returned."""
import sys
import threading
import time

import numpy as np
import pytest

import runtime as torch
import nnc
from nnc.codegen import nowait as nw

from helpers import run_in_threads

pytestmark = pytest.mark.skipif(not nw.AVAILABLE, reason="the helper thread needs Linux's futex")

MB = nw.MAILBOX.ctypes.data


def _operands(n, kdim, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(kdim).astype(dtype), rng.standard_normal(n * kdim).astype(dtype),
            np.full(n, np.nan, dtype))


def _serial(x, w, n):
    out = np.empty(n, x.dtype)
    nw.gemv_serial(x, w, out)
    return out


@pytest.fixture
def no_helper():
    """No helper thread runs during the test (the protocol's pieces are driven by hand); restarted afterwards."""
    nw.stop_helper()
    saved = nw.MAILBOX[nw._RUNNING]
    yield
    nw.MAILBOX[nw._RUNNING] = saved
    nw.MAILBOX[nw._HOOK] = 0
    nw.MAILBOX[nw._SLEEP] = 0
    nw.MAILBOX[nw._LOCK] = 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,kdim", [(0, 5), (1, 1), (5, 0), (1, 784), (7, 3), (512, 784), (203, 513), (10, 512),
                                    (3, 8), (3, 9), (2, 15), (3, 16), (3, 17), (5, 31), (5, 33), (2, 64), (3, 65)])
def test_serial_chunks_match_numpy(n, kdim, dtype):
    x, w, out = _operands(n, kdim, dtype)
    nw.gemv_serial(x, w, out)
    expected = w.reshape(n, kdim).astype(np.float64) @ x.astype(np.float64)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * max(1, kdim))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kdim", [1, 7, 16, 17, 33, 513])
def test_a_rows_bits_do_not_depend_on_the_rows_swept_with_it(dtype, kdim):
    """gemv_rows over any split of the rows (odd boundaries: a row swept alone or in a pair, at either place of
    the pair) gives the serial result bit for bit."""
    n = 37
    x, w, _ = _operands(n, kdim, dtype)
    expected = _serial(x, w, n)
    rng = np.random.default_rng(kdim)
    for _ in range(5):
        cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n, 6)]))
        out = np.full(n, np.nan, dtype)
        for s0, s1 in zip(cuts[:-1], cuts[1:]):
            nw.gemv_rows(x, w, out, int(s0), int(s1))
        np.testing.assert_array_equal(out, expected)
    for s in range(n):  # every row alone
        out = np.full(n, np.nan, dtype)
        nw.gemv_rows(x, w, out, s, s + 1)
        assert out[s] == expected[s] and np.isnan(np.delete(out, s)).all()


def test_gemv_rejects_a_weight_of_the_wrong_size():
    x, w, out = _operands(4, 8, np.float32)
    for product in (nw.gemv, nw.gemv_serial):
        with pytest.raises(ValueError, match="len\\(out\\) \\* len\\(x\\)"):
            product(x, w[:-1], out)


def test_chunk_rows():
    assert nw.chunk_rows(512, 784 * 4, 2 ** 17) == 40
    assert nw.chunk_rows(128, 9216 * 4, 2 ** 17) == 4
    assert nw.chunk_rows(4096, 8, 2 ** 17) >= 4096  # short rows: one chunk
    assert -(-16384 // nw.chunk_rows(16384, 3000, 2 ** 17)) <= nw.MAX_CHUNKS


@pytest.mark.parametrize("rows", [4, 8, 36])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_helper_chunks_copied_from_scratch_bit_identical(no_helper, dtype, rows):
    """Every chunk computed by the helper (into its scratch), then collected by the caller: the serial result, for
    any chunk size that is a multiple of 4."""
    n, kdim = 203, 513
    x, w, out = _operands(n, kdim, dtype)
    gen = int(nw.MAILBOX[nw._GEN]) + 1
    nchunks = -(-n // rows)
    nw._publish(MB, gen, x, w, n, rows, nchunks)
    nw._helper_chunks(MB, gen, x)
    assert all(nw.MAILBOX[nw._STATES + nw._STATE_WORDS * c] == gen * 4 + nw.READY for c in range(nchunks))
    assert np.isnan(out).all()  # the helper never writes the caller's output
    nw._collect(MB, gen * 4, x, w, out, rows, 0, nchunks)
    np.testing.assert_array_equal(out, _serial(x, w, n))


def test_stolen_chunk_is_recomputed_and_a_late_result_ignored(no_helper):
    """A chunk the helper claimed but has not finished is stolen; the helper's late result stays in its scratch."""
    n, kdim = 128, 300
    x, w, out = _operands(n, kdim, np.float32)
    gen = int(nw.MAILBOX[nw._GEN]) + 1
    rows = 8
    nchunks = -(-n // rows)
    nw._publish(MB, gen, x, w, n, rows, nchunks)
    last = nchunks - 1
    nw.MAILBOX[nw._STATES + nw._STATE_WORDS * last] = gen * 4 + nw.HELPER  # the helper is inside the last chunk
    nw._collect(MB, gen * 4, x, w, out, rows, 0, nchunks)
    assert all(nw.MAILBOX[nw._STATES + nw._STATE_WORDS * c] == gen * 4 + nw.CALLER for c in range(nchunks))
    expected = _serial(x, w, n)
    np.testing.assert_array_equal(out, expected)
    # the helper wakes up, finishes its chunk and tries to hand it over: refused, and `out` is not its to write
    assert not nw._hand_over(MB, last, gen * 4)
    assert nw.MAILBOX[nw._STATES + nw._STATE_WORDS * last] == gen * 4 + nw.CALLER
    np.testing.assert_array_equal(out, expected)


def test_collect_copies_ready_chunks_steals_the_helpers_and_computes_free_ones(no_helper):
    """The caller's end of a job in the usual state where they meet: free chunks, the helper's chunk in progress,
    then ready ones (their rows in the scratch). Every row comes out as the serial loop's."""
    n, kdim, rows = 40, 33, 8
    x, w, out = _operands(n, kdim, np.float32)
    expected = _serial(x, w, n)
    gen = int(nw.MAILBOX[nw._GEN]) + 1
    nw._publish(MB, gen, x, w, n, rows, 5)
    scratch = nw.MAILBOX[nw._SCRATCH:].view(np.float32)[:n]
    for c, state in ((2, nw.HELPER), (3, nw.READY), (4, nw.READY)):
        nw.MAILBOX[nw._STATES + nw._STATE_WORDS * c] = gen * 4 + state
    nw.gemv_rows(x, w, scratch, 3 * rows, n)  # the helper's results for chunks 3 and 4
    before = nw.counts()
    nw._collect(MB, gen * 4, x, w, out, rows, 1, 5)
    np.testing.assert_array_equal(out[rows:], expected[rows:])
    after = nw.counts()
    assert (after["helped"] - before["helped"], after["stolen"] - before["stolen"]) == (2, 1)
    assert [nw.MAILBOX[nw._STATES + nw._STATE_WORDS * c] - gen * 4 for c in range(1, 5)] == \
        [nw.CALLER, nw.CALLER, nw.READY, nw.READY]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_caller_alone_when_helper_sleeps_or_stopped(no_helper, dtype):
    x, w, out = _operands(512, 784, dtype)
    expected = _serial(x, w, 512)
    nw.gemv(x, w, out)  # stopped: the serial path
    np.testing.assert_array_equal(out, expected)
    before = nw.counts()
    nw.MAILBOX[nw._RUNNING] = 1
    nw.MAILBOX[nw._SLEEP] = 1  # "asleep": the caller wakes it (nobody is there) and computes every chunk
    out[:] = np.nan
    nw.gemv(x, w, out)
    np.testing.assert_array_equal(out, expected)
    after = nw.counts()
    assert after["jobs"] == before["jobs"] + 1 and after["helped"] == before["helped"]
    assert nw.MAILBOX[nw._SLEEP] == 0 and nw.MAILBOX[nw._LOCK] == 0


def test_late_helper_never_changes_a_returned_result(no_helper):
    """A real helper loop held inside a claimed chunk (the test hook) while the caller steals the chunk and returns:
    releasing it later leaves the result untouched, and the next call is still exact."""
    f32, f64 = np.zeros(1, np.float32), np.zeros(1, np.float64)
    nw.MAILBOX[nw._STOP] = 0
    nw.MAILBOX[nw._RUNNING] = 1
    nw.MAILBOX[nw._HOOK] = 1
    helper = threading.Thread(target=nw._helper_main, args=(f32, f64), daemon=True)  # normal priority here
    helper.start()
    try:
        x, w, out = _operands(512, 784, np.float32, seed=1)
        expected = _serial(x, w, 512)
        deadline = time.monotonic() + 60
        while nw.MAILBOX[nw._HOOK] != 2:  # until the helper is paused inside a chunk of a call that returned
            assert time.monotonic() < deadline, "the helper thread never claimed a chunk"
            out[:] = np.nan
            nw.gemv(x, w, out)
            np.testing.assert_array_equal(out, expected)
        stale_gen = int(nw.MAILBOX[nw._HELPER_IN])
        assert stale_gen != 0
        returned = out.copy()
        x2, _, out2 = _operands(512, 784, np.float32, seed=2)
        nw.gemv(x2, w, out2)  # a new job while the stale helper is still held: the caller does it all
        np.testing.assert_array_equal(out2, _serial(x2, w, 512))
        nw.MAILBOX[nw._HOOK] = 0  # release it: it finishes the stale chunk into its scratch
        while nw.MAILBOX[nw._HELPER_IN] == stale_gen:
            assert time.monotonic() < deadline, "the released helper never left its chunk"
            time.sleep(0.001)
        np.testing.assert_array_equal(out, returned)
        for _ in range(200):  # and the helper keeps helping exactly
            out[:] = np.nan
            nw.gemv(x, w, out)
            np.testing.assert_array_equal(out, expected)
    finally:
        nw.MAILBOX[nw._HOOK] = 0
        nw.MAILBOX[nw._STOP] = 1
        helper.join(10)
    assert not helper.is_alive()


def test_retain_keeps_arrays_while_helper_in_chunk(no_helper):
    a = [np.zeros(3)]
    nw.MAILBOX[nw._HELPER_IN] = 7
    try:
        nw.retain(a)
        nw.retain(a)  # the same arrays again: kept once
        assert len(nw._RETAINED) == 1 and nw._RETAINED[0][0] is a[0]
    finally:
        nw.MAILBOX[nw._HELPER_IN] = 0
    nw.retain(a)
    assert nw._RETAINED == []


def _mlp(dtype):
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    model.eval()
    return model.to(dtype)


@pytest.mark.parametrize("whole_graph", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_mlp_batch1_with_and_without_helper(whole_graph, dtype):
    """The compiled batch-1 MLP runs its two large layers with the helper: the same bits as without it, close to
    eager; from two Python threads at once as well."""
    model = _mlp(dtype)
    compiled = nnc.compile(model, whole_graph=whole_graph)
    xs = [torch.randn(1, 784).to(dtype) for _ in range(4)]
    with torch.no_grad():
        eager = [model(x).numpy() for x in xs]
        first = [compiled(x).numpy() for x in xs]
        assert nw.ensure_helper()
        saved = nw.MAILBOX[nw._RUNNING]
        nw.MAILBOX[nw._RUNNING] = 0  # every product serial
        try:
            serial = [compiled(x).numpy() for x in xs]
        finally:
            nw.MAILBOX[nw._RUNNING] = saved
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        for e, f, s in zip(eager, first, serial):
            np.testing.assert_allclose(f, e, rtol=tol, atol=tol)
            np.testing.assert_array_equal(f, s)
        errors = []

        def calls(k):
            with torch.no_grad():
                for _ in range(100):
                    y = compiled(xs[k]).numpy()
                    if not np.array_equal(y, serial[k]):
                        errors.append((k, np.abs(y - serial[k]).max()))
        run_in_threads(calls, 2)
        assert errors == []


@pytest.mark.parametrize("whole_graph", [True, False])
def test_compiling_a_batch1_mlp_starts_the_helper(whole_graph):
    """Compiling a model whose products call the helper's gemv starts the helper thread, and its calls publish
    jobs to it. The gemv calls live in the matmul kernels' libraries, not in the kernel modules: a check of the
    kernel module alone left the helper unstarted and every product serial."""
    nw.stop_helper()
    assert nw.MAILBOX[nw._RUNNING] == 0
    compiled = nnc.compile(_mlp(torch.float32), whole_graph=whole_graph)
    with torch.no_grad():
        compiled(torch.randn(1, 784))
        assert nw._THREAD is not None and nw._THREAD.is_alive()
        deadline = time.perf_counter() + 10
        while nw.MAILBOX[nw._RUNNING] == 0 and time.perf_counter() < deadline:  # the thread says when it is up
            time.sleep(0.001)
        before = nw.counts()["jobs"]
        compiled(torch.randn(1, 784))
    assert nw.counts()["jobs"] == before + 2  # the 784x512 and 512x512 layers; the 512x10 head is a serial loop


def test_mlp_kernels_use_helper_only_for_large_layers():
    """The batch-1 MLP's 784x512 and 512x512 layers call the helper's product; its 512x10 head stays a serial loop."""
    with torch.no_grad():
        report = nnc.explain(_mlp(torch.float32), torch.randn(1, 784))
    calls = [("nowait_gemv(" in k.source) for k in report.kernels if k.kind == "matmul"]
    assert calls == [True, True, False]


@pytest.mark.parametrize("whole_graph", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kdim,n", [(784, 512), (4099, 33)])
def test_helper_code_matches_the_compiled_kernel_bit_for_bit(no_helper, whole_graph, dtype, kdim, n):
    """The helper's chunks (its own compiled code, computing every chunk) equal the compiled kernel's product run
    serially on the caller, where numba inlines the chunk code into the kernel (or the whole graph)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(kdim, n, bias=False)).to(dtype)
    model.eval()
    x = torch.randn(1, kdim).to(dtype)
    compiled = nnc.compile(model, whole_graph=whole_graph)
    with torch.no_grad():
        kernel = compiled(x).numpy().reshape(-1)
    nw.stop_helper()  # compiling started one: the job below is driven by hand, with no other helper about
    xa, w = x.numpy().reshape(-1), model[0].weight.detach().numpy().reshape(-1)
    out = np.full(n, np.nan, xa.dtype)
    gen = int(nw.MAILBOX[nw._GEN]) + 1
    rows = nw.chunk_rows(n, kdim * xa.itemsize, nw.CHUNK_BYTES)
    nchunks = -(-n // rows)
    helped = nw.counts()["helped"]
    nw._publish(MB, gen, xa, w, n, rows, nchunks)
    nw._helper_chunks(MB, gen, xa)
    nw._collect(MB, gen * 4, xa, w, out, rows, 0, nchunks)
    assert nw.counts()["helped"] == helped + nchunks  # every chunk came from the helper's scratch
    np.testing.assert_array_equal(out, kernel)


# --- batched rows (Winograd's products, nnc.codegen.rows_kernel) -------------------------------------------------

ROWS_SHAPE = (36, 64, 32, 36)  # the MNIST CNN's conv2 at batch 1: batch, rows, kdim, n_out


def _rows_operands(dtype, seed=0, shape=ROWS_SHAPE):
    batch, rows, kdim, n_out = shape
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch * rows * kdim).astype(dtype)
    b = rng.standard_normal(batch * kdim * n_out).astype(dtype)
    return a, b, np.full(batch * rows * n_out, np.nan, dtype)


def _rows_serial(a, b, shape=ROWS_SHAPE):
    out = np.empty(shape[0] * shape[1] * shape[3], a.dtype)
    nw.rows_product(a, b, out, *shape[1:])
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_helper_chunks_from_scratch_and_stolen_ones_bit_identical(no_helper, dtype):
    """A batched-rows job: the helper computes every chunk but the last, which it is still inside when the caller
    collects (stolen and recomputed); the caller's output is the serial product's, bit for bit, and the helper never
    wrote it."""
    shape = (5, 7, 33, 29)  # rows left after the blocks of four, an odd sum, a masked tail
    a, b, out = _rows_operands(dtype, shape=shape)
    nw.MAILBOX[nw._RCHUNK_WORK] = 4 * 33 * 29 * 2  # two tasks a chunk: several chunks
    try:
        gen = int(nw.MAILBOX[nw._GEN]) + 1
        ntasks, per, nchunks = nw._publish_rows(MB, gen, a, b, out, *shape[1:])
    finally:
        nw.MAILBOX[nw._RCHUNK_WORK] = nw.ROWS_CHUNK_WORK
    assert (ntasks, per, nchunks) == (10, 2, 5)
    tag = gen * 4
    nw._helper_rows(MB, gen, a)
    assert all(nw.MAILBOX[nw._STATES + nw._STATE_WORDS * c] == tag + nw.READY for c in range(nchunks))
    assert np.isnan(out).all()
    nw.MAILBOX[nw._STATES + nw._STATE_WORDS * (nchunks - 1)] = tag + nw.HELPER  # "still inside" the last one
    before = nw.counts()
    nw._collect_rows(MB, tag, a, b, out, *shape[1:], 0)
    after = nw.counts()
    assert (after["helped"] - before["helped"], after["stolen"] - before["stolen"]) == (nchunks - 1, 1)
    np.testing.assert_array_equal(out, _rows_serial(a, b, shape))


def test_rows_late_helper_keeps_the_operands_until_it_leaves(no_helper):
    """A real helper loop held inside a claimed chunk (the test hook) while the caller finishes the job alone and
    returns: the job keeps a reference to a and b (they may be a whole graph's temporaries) while the helper is
    inside, a second job meanwhile runs serially, and once the helper has left, the next job drops them."""
    f32, f64 = np.zeros(1, np.float32), np.zeros(1, np.float64)
    nw.MAILBOX[nw._STOP] = 0
    nw.MAILBOX[nw._RUNNING] = 1
    nw.MAILBOX[nw._HOOK] = 1
    helper = threading.Thread(target=nw._helper_main, args=(f32, f64), daemon=True)
    helper.start()
    try:
        a, b, out = _rows_operands(np.float32, seed=1)
        expected = _rows_serial(a, b)
        refs = sys.getrefcount(a), sys.getrefcount(b)
        deadline = time.monotonic() + 60
        while nw.MAILBOX[nw._HOOK] != 2:  # until the helper is paused inside a chunk of a call that returned
            assert time.monotonic() < deadline, "the helper thread never claimed a chunk"
            out[:] = np.nan
            nw.batched_rows(a, b, out, *ROWS_SHAPE[1:])
            np.testing.assert_array_equal(out, expected)
        held = int(nw.MAILBOX[nw._HELPER_IN])
        assert held != 0 and nw.MAILBOX[nw._HOLD_GEN] == held
        assert (sys.getrefcount(a), sys.getrefcount(b)) == (refs[0] + 1, refs[1] + 1)
        a2, b2, out2 = _rows_operands(np.float32, seed=2)
        jobs = nw.counts()["jobs"]
        nw.batched_rows(a2, b2, out2, *ROWS_SHAPE[1:])  # the helper is still held: serial, nothing published
        np.testing.assert_array_equal(out2, _rows_serial(a2, b2))
        assert nw.counts()["jobs"] == jobs and nw.MAILBOX[nw._HOLD_GEN] == held
        nw.MAILBOX[nw._HOOK] = 0  # release it: it finishes the stale chunk into its scratch and leaves
        while nw.MAILBOX[nw._HELPER_IN] == held:
            assert time.monotonic() < deadline, "the released helper never left its chunk"
            time.sleep(0.001)
        for _ in range(50):  # the next job drops the references; the helper keeps helping exactly
            out2[:] = np.nan
            nw.batched_rows(a2, b2, out2, *ROWS_SHAPE[1:])
            np.testing.assert_array_equal(out2, _rows_serial(a2, b2))
        assert nw.MAILBOX[nw._HOLD_GEN] != held
        assert (sys.getrefcount(a), sys.getrefcount(b)) == refs
    finally:
        nw.MAILBOX[nw._HOOK] = 0
        nw.MAILBOX[nw._STOP] = 1
        helper.join(10)
        nw.MAILBOX[nw._STOP] = 0
    assert not helper.is_alive()
