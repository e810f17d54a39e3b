"""The register-blocked microkernel of the "batched_rows" products (nnc.codegen.cpu_small_gemm): numba code that
emits LLVM vector FMAs directly, one compiled function for every shape, shared by the caller and nnc.codegen.nowait's
helper thread.

out[p] = a[p] @ b[p] for same-batch products, a (batch, rows, kdim), b (batch, kdim, n_out) and out, all flat and
C-contiguous. A task is a block of BLOCK_ROWS rows of one product (fewer at the end of a product): its outputs stay
in vector registers (BLOCK_ROWS x up to 3 vectors along the columns, the last one masked to the row's end) while
the sum runs over k, each b vector loaded once for the block's rows and each a[r, k] broadcast once for the
row's vectors. Every output element is one chain of FMAs in k order (an LLVM fma each, never reassociated), so
the result does not depend on which function, thread or task order computed it: `rows_tasks` over any split of the
tasks is bit-identical to `rows_product`.

A row longer than 3 vectors (float64 rows of more than 24 columns) runs as column passes of up to 3 vectors.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

BLOCK_ROWS = 4
PASS_VECTORS = 3  # vectors along the columns a pass keeps per row (4 x 3 accumulators, their b vectors, broadcasts)
VECTOR_BYTES = 64  # one 512-bit register (narrower hardware splits the LLVM vectors)


def lanes(itemsize: int) -> int:
    """Elements in one vector of this item size."""
    return VECTOR_BYTES // itemsize


def _element(context, builder, aryty, ary, index, vt=None):
    """A pointer to ary[index] (as a pointer to a vector of type vt when given)."""
    p = builder.gep(context.make_array(aryty)(context, builder, ary).data, [index])
    return builder.bitcast(p, ir.PointerType(vt)) if vt is not None else p


def _splat(builder, value, n):
    """The scalar in all n lanes."""
    vt = ir.VectorType(value.type, n)
    v = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))


def _block_codegen(nrows, nvec, packed):
    """The block's LLVM code: nrows rows x nvec vectors of accumulators, the last vector masked to the pass's
    width; `packed`: the last vector instead holds every row's tail (at most G = lanes // nrows columns), row r in
    lanes [r*G, r*G + G), so the rows' tails take one FMA a k, not one each."""
    def codegen(context, builder, sig, args):
        a, b, out, a0, b0, o0, kdim, n_out, width = args[:9]
        aty, bty, oty = sig.args[:3]
        dt = aty.dtype
        et, L, size = context.get_value_type(dt), lanes(dt.bitwidth // 8), dt.bitwidth // 8
        G = L // nrows
        vt, i64, i32 = ir.VectorType(et, L), ir.IntType(64), ir.IntType(32)
        module, align = builder.module, ir.Constant(i32, size)
        fma = cgutils.get_or_insert_function(module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{L}f{dt.bitwidth}")

        def masked(n):  # llvm.masked.load and .store of n lanes
            t, m = ir.VectorType(et, n), ir.VectorType(ir.IntType(1), n)
            suffix = f"v{n}f{dt.bitwidth}"
            load = cgutils.get_or_insert_function(module, ir.FunctionType(t, [ir.PointerType(t), i32, m, t]),
                                                  f"llvm.masked.load.{suffix}.p0")
            store_type = ir.FunctionType(ir.VoidType(), [t, ir.PointerType(t), i32, m])
            store = cgutils.get_or_insert_function(module, store_type, f"llvm.masked.store.{suffix}.p0")
            return load, store

        def lanes_below(n, count):  # the mask of an n-lane vector's lanes < count
            return builder.icmp_unsigned("<", ir.Constant(ir.VectorType(i64, n), list(range(n))),
                                         _splat(builder, count, n))

        def at(aryty, ary, index, n=L):  # ary[index] as a pointer to an n-lane vector
            return _element(context, builder, aryty, ary, index, ir.VectorType(et, n))

        full = nvec - 1  # unmasked vectors a row
        tail = builder.sub(width, ir.Constant(i64, full * L))  # columns in the last vector (of each row)
        n_tail = G if packed else L
        tail_load, tail_store = masked(n_tail)
        tail_mask = lanes_below(n_tail, tail)
        zero = ir.Constant(vt, [ir.Constant(et, 0.0)] * L)
        tail_zero = ir.Constant(ir.VectorType(et, n_tail), [ir.Constant(et, 0.0)] * n_tail)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(full if packed else nvec)]
                for _ in range(nrows)]
        tail_acc = cgutils.alloca_once_value(builder, zero) if packed else None
        with cgutils.for_range(builder, kdim) as loop:
            k = loop.index
            brow = builder.add(b0, builder.mul(k, n_out))
            bvs = [builder.load(at(bty, b, builder.add(brow, ir.Constant(i64, v * L))), align=size)
                   for v in range(full)]
            btail = builder.call(tail_load, [at(bty, b, builder.add(brow, ir.Constant(i64, full * L)), n_tail),
                                             align, tail_mask, tail_zero])
            if packed:  # b's tail columns in every row's lanes
                btail = builder.shuffle_vector(btail, btail, ir.Constant(ir.VectorType(i32, L),
                                                                         [j % G for j in range(L)]))
            else:
                bvs.append(btail)
            xtail = None
            for r in range(nrows):
                index = builder.add(a0, builder.add(builder.mul(ir.Constant(i64, r), kdim), k))
                x = _splat(builder, builder.load(_element(context, builder, aty, a, index)), L)
                for v, acc in enumerate(accs[r]):
                    builder.store(builder.call(fma, [x, bvs[v], builder.load(acc)]), acc)
                if packed:  # row r's a[r, k] in its lanes
                    rows_lanes = ir.Constant(ir.VectorType(ir.IntType(1), L), [j // G == r for j in range(L)])
                    xtail = x if xtail is None else builder.select(rows_lanes, x, xtail)
            if packed:
                builder.store(builder.call(fma, [xtail, btail, builder.load(tail_acc)]), tail_acc)
        for r in range(nrows):
            orow = builder.add(o0, builder.mul(ir.Constant(i64, r), n_out))
            for v, acc in enumerate(accs[r]):
                p = at(oty, out, builder.add(orow, ir.Constant(i64, v * L)))
                if v == full:
                    builder.call(tail_store, [builder.load(acc), p, align, tail_mask])
                else:
                    builder.store(builder.load(acc), p, align=size)
            if packed:
                value = builder.load(tail_acc)
                piece = builder.shuffle_vector(value, value, ir.Constant(ir.VectorType(i32, G),
                                                                         [r * G + j for j in range(G)]))
                p = at(oty, out, builder.add(orow, ir.Constant(i64, full * L)), G)
                builder.call(tail_store, [piece, p, align, tail_mask])
        return context.get_dummy_value()
    return codegen


@intrinsic
def _block(typingctx, a, b, out, a0, b0, o0, kdim, n_out, width, nrows, nvec, packed):
    """out[o0 + r * n_out + j] = sum over k of a[a0 + r * kdim + k] * b[b0 + k * n_out + j] for r < nrows and
    j < width (nvec - 1 < width / lanes <= nvec), the sum in k order as one FMA chain per element; `packed`: the
    rows' last columns share one vector (at most lanes // nrows of them)."""
    if not all(isinstance(x, types.IntegerLiteral) for x in (nrows, nvec, packed)):
        return None  # numba retries with the literal values
    sig = types.void(a, b, out, *[types.int64] * 6, nrows, nvec, packed)
    return sig, _block_codegen(nrows.literal_value, nvec.literal_value, bool(packed.literal_value))


@njit(cache=True, nogil=True, error_model="numpy")
def _pass(a, b, out, a0, b0, o0, kdim, n_out, width, nblocks, rest):
    """One column pass of `width` columns (at most PASS_VECTORS vectors) over nblocks blocks of BLOCK_ROWS rows
    from a0 / o0 on, then `rest` rows one by one (all in one product). NOTE: the loops over blocks sit inside the
    variants, so a block costs no dispatch: a block of conv2's product is ~150 cycles of FMAs, and a call a block
    made rows_tasks ~10% slower."""
    n_lanes = VECTOR_BYTES // a.itemsize
    nvec = (width + n_lanes - 1) // n_lanes
    tail = width - (nvec - 1) * n_lanes
    step_a, step_o = BLOCK_ROWS * kdim, BLOCK_ROWS * n_out
    if tail * BLOCK_ROWS <= n_lanes:  # the rows' short tails share one vector
        if nvec == 3:
            for i in range(nblocks):
                _block(a, b, out, a0 + i * step_a, b0, o0 + i * step_o, kdim, n_out, width, 4, 3, 1)
        elif nvec == 2:
            for i in range(nblocks):
                _block(a, b, out, a0 + i * step_a, b0, o0 + i * step_o, kdim, n_out, width, 4, 2, 1)
        else:
            for i in range(nblocks):
                _block(a, b, out, a0 + i * step_a, b0, o0 + i * step_o, kdim, n_out, width, 4, 1, 1)
    elif nvec == 3:
        for i in range(nblocks):
            _block(a, b, out, a0 + i * step_a, b0, o0 + i * step_o, kdim, n_out, width, 4, 3, 0)
    elif nvec == 2:
        for i in range(nblocks):
            _block(a, b, out, a0 + i * step_a, b0, o0 + i * step_o, kdim, n_out, width, 4, 2, 0)
    else:
        for i in range(nblocks):
            _block(a, b, out, a0 + i * step_a, b0, o0 + i * step_o, kdim, n_out, width, 4, 1, 0)
    a0, o0 = a0 + nblocks * step_a, o0 + nblocks * step_o
    for r in range(rest):
        if nvec == 3:
            _block(a, b, out, a0 + r * kdim, b0, o0 + r * n_out, kdim, n_out, width, 1, 3, 0)
        elif nvec == 2:
            _block(a, b, out, a0 + r * kdim, b0, o0 + r * n_out, kdim, n_out, width, 1, 2, 0)
        else:
            _block(a, b, out, a0 + r * kdim, b0, o0 + r * n_out, kdim, n_out, width, 1, 1, 0)


@njit(cache=True, nogil=True, error_model="numpy")
def blocks_per_product(rows):
    """Tasks of one product: its rows in blocks of BLOCK_ROWS, the last one maybe shorter."""
    return (rows + BLOCK_ROWS - 1) // BLOCK_ROWS


@njit(cache=True, nogil=True, error_model="numpy")
def rows_tasks(a, b, out, t0, t1, rows, kdim, n_out):
    """Tasks t0 <= t < t1 (blocks of rows, `blocks_per_product(rows)` a product) of out[p] = a[p] @ b[p]."""
    nblk = blocks_per_product(rows)
    step = PASS_VECTORS * (VECTOR_BYTES // a.itemsize)
    t = t0
    while t < t1:  # the tasks' runs within one product
        p, blk0 = t // nblk, t % nblk
        blk1 = min(nblk, blk0 + t1 - t)
        r0, r1 = blk0 * BLOCK_ROWS, min(rows, blk1 * BLOCK_ROWS)
        nblocks = (r1 - r0) // BLOCK_ROWS
        a0, b0, o0 = (p * rows + r0) * kdim, p * kdim * n_out, (p * rows + r0) * n_out
        for c0 in range(0, n_out, step):
            _pass(a, b, out, a0, b0 + c0, o0 + c0, kdim, n_out, min(step, n_out - c0), nblocks,
                  r1 - r0 - nblocks * BLOCK_ROWS)
        t += blk1 - blk0


@njit(cache=True, nogil=True, error_model="numpy")
def rows_product(a, b, out, rows, kdim, n_out):
    """Every product on this thread (out.size // (rows * n_out) of them)."""
    if rows == 0 or n_out == 0:
        return
    batch = out.shape[0] // (rows * n_out)
    if kdim == 0:
        out[:] = 0
        return
    rows_tasks(a, b, out, 0, batch * blocks_per_product(rows), rows, kdim, n_out)
