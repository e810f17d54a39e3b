"""CPU row kernels: a chain of reductions over the same rows (softmax, LayerNorm), walked one row at a time.

A row kernel (fusion's kind "row") holds reductions that share one signature (input shape, reduced dims, reduced
shape with the dims kept) and elementwise nodes of the input shape ("along the row") or of the reduced shape ("per
row"). A node's level is the number of reductions it waits for: a reduction reading a value of level L has level
L + 1. Each row is walked in passes: pass p computes the values of level p along the row, accumulates the
reductions of level p + 1 and stores the outputs of level p; values per row of level p are computed once per row
before pass p (or after the last pass). A value along the row that a later pass needs again is kept in a row
buffer per task when it is expensive (RowPlan.held: softmax's exp) and the row is static and short enough, else
recomputed there from the kernel's inputs (LayerNorm's x - mean: a load and a subtraction). So softmax is max, then
the sum of exp (kept), then exp / sum, in three loops over each row of one kernel.

The schedule (`row_schedule`, a pure value of the shapes): prange over rows once the rows' work
reaches PARALLEL_MIN_ELEMENTS cheap elements (cpu_elementwise.parallel_work: the passes over each element and what
they compute); a pass with reductions fills blocks of values that a vectorized helper reduces
(cpu_reduction's block helpers), as the row reduction skeleton does. A kernel with buffers runs tasks of runs of
rows, each allocating its buffers once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.ops import Kind

from ..graph import Node
from ..kernel import Kernel
from ..symbolic import is_symbolic
from .cpu_elementwise import Array, Function, KernelBuilder, ParallelLoop, indent, launch_line, parallel_work
from .cpu_reduction import (_BLOCK, _MIN_BLOCKED, _Accumulator, _acc_term, _block_helper_of, _combine,
                            accumulators, blockable)
from .indexing import collapse, emit_offsets, shifted
from .scalar import Dialect, Unsupported, Value, ctor, expensive, node_shape, op_and_attrs


@dataclass(frozen=True)
class RowSchedule(ParallelLoop):
    """How a row kernel's loops are laid out: a task per row (`n_outer` of them, a prange when `parallel`), and in
    each task `passes` loops over the row's `n_red` positions; a pass with reductions reduces `block` values at a
    time through a vectorized helper when `blocked`."""

    parallel: bool
    n_outer: int
    n_red: int
    passes: int
    blocked: bool
    block: int

    @property
    def tasks(self) -> int:
        """Tasks of the blocked form, each a run of rows sharing its block buffers (one task when serial)."""
        return _ROW_TASKS if self.parallel else 1

    @property
    def rows_per_task(self):
        return -(-self.n_outer // self.tasks) if not is_symbolic(self.n_outer) else f"(({self.n_outer}) + " \
            f"{self.tasks - 1}) // {self.tasks}"


# Rows of at most this many values keep their expensive values in a row buffer per task (RowPlan.held).
_MAX_HELD = 2 ** 14
# The blocked form runs this many parallel tasks, each over a run of rows (allocating its block buffers once).
_ROW_TASKS = 64


def row_schedule(shape, dims, passes: int, blockable_: bool = True, along=()) -> RowSchedule:
    """The schedule of a row kernel over `shape` whose rows run along `dims`, walked `passes` times, computing the
    nodes `along` the row."""
    n_outer = math.prod(shape[d] for d in range(len(shape)) if d not in dims)
    n_red = math.prod(shape[d] for d in dims)
    parallel = parallel_work(n_outer * n_red, along, passes)
    if is_symbolic(n_red):
        return RowSchedule(parallel, n_outer, n_red, passes, blockable_, _BLOCK)
    blocked = blockable_ and n_red >= _MIN_BLOCKED
    return RowSchedule(parallel, n_outer, n_red, passes, blocked, min(_BLOCK, n_red))


@dataclass
class RowPlan:
    """What each pass of a row kernel computes: levels of the nodes, the nodes along the row and per row, and the
    reductions (`accs`, in kernel order)."""

    accs: list[_Accumulator]
    along: list[Node]    # elementwise nodes of the input shape
    per_row: list[Node]  # elementwise nodes of the reduced shape
    level: dict          # node -> how many reductions it waits for (kernel inputs: 0)
    passes: int

    def pass_accs(self, p: int) -> list[_Accumulator]:
        return [a for a in self.accs if self.level[a.node] == p + 1]

    def stage(self, s: int) -> list[Node]:
        """The values per row computed before pass s (after the last pass when s == passes)."""
        return [n for n in self.per_row if min(self.level[n], self.passes) == s]

    def pass_nodes(self, p: int, stored: list[Node], held=frozenset()) -> tuple[list[Node], list[Node]]:
        """(computed, reloaded): the nodes along the row that pass p computes, what its reductions and its stores
        need (in order), and the held nodes of earlier passes it reads back from their row buffers instead."""
        along = set(self.along)
        need, reloaded, todo = set(), set(), [a.source for a in self.pass_accs(p)] + list(stored)
        while todo:
            n = todo.pop()
            if n in held and self.level[n] < p:
                reloaded.add(n)
            elif n in along and n not in need:
                need.add(n)
                todo.extend(n.all_input_nodes)
        return [n for n in self.along if n in need], [n for n in self.along if n in reloaded]

    def held(self, stored_in) -> list[Node]:
        """The expensive nodes along the row (a transcendental, a power) that a pass computes and a later pass
        needs again: kept in a row buffer by the pass that computes them. stored_in(p): the nodes pass p stores."""
        computed_in: dict[Node, set] = {}
        for p in range(self.passes):
            for n in self.pass_nodes(p, stored_in(p))[0]:
                computed_in.setdefault(n, set()).add(p)
        return [n for n in self.along if expensive(n) and len(computed_in.get(n, ())) > 1
                and self.level[n] in computed_in[n]]


def plan_rows(kernel: Kernel, dialect: Dialect) -> RowPlan:
    """The levels and passes of a row kernel, after checking its nodes fit one (Unsupported otherwise)."""
    accs = accumulators(kernel, dialect)
    shape, out_shape = tuple(kernel.shape), accs[0].out_shape
    reductions = {a.node for a in accs}
    along, per_row, level = [], [], {}
    for n in kernel.nodes:
        inside = [level[a] for a in n.all_input_nodes if a in level]
        if n in reductions:
            level[n] = max(inside, default=0) + 1
            continue
        op, _, _ = op_and_attrs(n)
        if op.kind != Kind.ELEMENTWISE:
            raise Unsupported(f"node {n.name}: op {op.name} ({op.kind}) is neither a reduction nor elementwise")
        if node_shape(n) == shape:
            along.append(n)
        elif node_shape(n) == out_shape:
            per_row.append(n)
        else:
            raise Unsupported(f"node {n.name} has shape {list(node_shape(n))}, neither the row kernel's shape "
                              f"{list(shape)} nor its reduced shape {list(out_shape)}")
        level[n] = max(inside, default=0)
    passes = max([level[n] for n in along] + [level[a.node] - 1 for a in accs]) + 1
    return RowPlan(accs, along, per_row, level, passes)


def row_schedule_of(kernel: Kernel) -> RowSchedule:
    plan = plan_rows(kernel, Dialect())
    return row_schedule(tuple(kernel.shape), plan.accs[0].dims, plan.passes, blockable(plan.accs), plan.along)


def gen_rows(kb: KernelBuilder) -> None:
    """The row skeleton: per row, the values per row of each stage, then a loop over the row per pass."""
    plan = plan_rows(kb.kernel, kb.dialect)
    shape, dims = tuple(kb.kernel.shape), plan.accs[0].dims
    schedule = row_schedule(shape, dims, plan.passes, blockable(plan.accs), plan.along)
    io = _row_io(kb, plan, shape, dims)
    # NOTE: a row buffer per task keeps what a recomputation would cost most (softmax's exp: 1.4x the kernel)
    held = plan.held(lambda p: [a.node for a in io.stored_in(p)]) \
        if not is_symbolic(schedule.n_red) and schedule.n_red <= _MAX_HELD else []
    hold = {n: f"hold{i}" for i, n in enumerate(held)}
    env: dict[Node, Value] = {}
    task = io.row_lines + _row_loads(kb, io, env)
    kb.body.index_of = _element_index(plan, shape, dims, schedule)
    try:
        for p in range(plan.passes):
            task += kb.body.emit(plan.stage(p), env)
            task += _pass_lines(kb, plan, schedule, io, env, p, hold)
        task += kb.body.emit(plan.stage(plan.passes), env)
    finally:
        kb.body.index_of = None
    task += [f"{a.arg}[{io.row_refs[id(a)]}] = {env[a.node].name}" for a in io.row_outs]
    buffers = [f"{a.buf} = np.empty({schedule.block}, dtype={ctor(a.in_dtype)})" for a in plan.accs
               if schedule.blocked and a.source not in io.direct and a.source not in hold]
    buffers += [f"{hold[n]} = np.empty({schedule.n_red}, dtype={ctor(env[n].dtype)})" for n in held]
    f = Function(kb.name, _unique(kb.ins + kb.outs), _task_loop(schedule, buffers, task), schedule.parallel)
    kb.functions.append(f)
    kb.launch = [launch_line(f)]


def _element_index(plan: RowPlan, shape, dims, schedule: RowSchedule):
    """index_of for random draws (OpDef.needs_index): the flat index of a node's element in its own shape. With the
    trailing dims reduced, row o's element r is at o * row length + r, and a value per row at o; fusion lets draws
    into other row kernels never (nnc.passes.fusion._trailing_rows), so they get None."""
    if tuple(dims) != tuple(range(len(shape) - len(dims), len(shape))):
        return None
    per_row, n_red = set(plan.per_row), schedule.n_red
    length = str(n_red) if str(n_red).isdigit() else f"({n_red})"
    return lambda node: "o" if node in per_row else f"o * {length} + r"


@dataclass
class _RowIO:
    """A row kernel's arrays and how a row reads them: along the row (`ref_of`: at reduced position r) or once per
    row (`row_refs`: at kept position o)."""

    along_ins: list[Array]
    along_outs: list[Array]
    row_ins: list[Array]
    row_outs: list[Array]
    level: dict
    row_lines: list[str]    # per row: the digits of o and the row views
    digit_lines: list[str]  # per element: the digits of r (when the reduced dims do not collapse)
    ref_of: dict            # id(array) -> its element at r
    row_refs: dict          # id(array) -> its offset at o
    hoisted: set            # id(array) of the arrays along the row that are constant along it
    direct: dict            # input node -> its row view, for inputs read contiguously along the row

    def stored_in(self, p: int) -> list[Array]:
        return [a for a in self.along_outs if self.level[a.node] == p]


def _row_io(kb: KernelBuilder, plan: RowPlan, shape, dims) -> _RowIO:
    kept = [d for d in range(len(shape)) if d not in dims]
    along = set(plan.along)
    along_reads = set(a for n in plan.along for a in n.all_input_nodes) | {a.source for a in plan.accs}
    along_ins = [a for a in kb.reads if a.node in along_reads]
    along_outs = [a for a in kb.outs if a.node in along]
    row_ins = [a for a in kb.reads if any(a.node in n.all_input_nodes for n in plan.per_row)]
    row_outs = [a for a in kb.outs if a.node not in along]
    arrays = along_ins + along_outs
    view_lines, refs, hoisted, digit_lines = _row_addressing(arrays, shape, kept, dims)
    everything = arrays + row_ins + row_outs
    o_lines, o_offs = emit_offsets([shape[d] for d in kept],
                                   [[s[d] for d in kept] for s in (a.strides_in(shape) for a in everything)], "o", "o_")
    o_offs = [shifted(oo, a.offset) for a, oo in zip(everything, o_offs)]
    ref_of = dict(zip([id(a) for a in arrays], refs))
    # inputs read contiguously along the row: a reduction of one reduces blocks of its row view in place
    direct = {a.node: ref_of[id(a)][:-len("[r]")] for a in along_ins if ref_of[id(a)].endswith("[r]")}
    return _RowIO(along_ins, along_outs, row_ins, row_outs, plan.level, o_lines + view_lines, digit_lines, ref_of,
                  dict(zip([id(a) for a in everything], o_offs)), hoisted, direct)


def _row_loads(kb: KernelBuilder, io: _RowIO, env) -> list[str]:
    """Loads of the inputs read once per row (read per row, or constant along it)."""
    lines, loaded = [], set()
    for a in [a for a in io.along_ins if id(a) in io.hoisted] + io.row_ins:
        if a.node not in loaded:  # NOTE: by node: two folded views of one argument are two values
            loaded.add(a.node)
            env[a.node] = Value(kb.value_name(a.node), a.dtype)
            lines.append(f"{env[a.node].name} = {a.arg}[{io.row_refs[id(a)]}]")
    return lines


def _pass_lines(kb: KernelBuilder, plan: RowPlan, schedule: RowSchedule, io: _RowIO, env, p: int,
                hold: dict) -> list[str]:
    """Pass p over the row: loads (inputs, and held values of earlier passes), the nodes it computes, its stores
    (outputs of its level, values it holds for later passes) and its reductions."""
    stored = io.stored_in(p)
    nodes, reloaded = plan.pass_nodes(p, [a.node for a in stored], set(hold))
    reads = set(a for n in nodes for a in n.all_input_nodes) | {a.source for a in plan.pass_accs(p)}
    loads = [f"{kb.value_name(a.node)} = {io.ref_of[id(a)]}" for a in io.along_ins
             if a.node in reads and id(a) not in io.hoisted]
    loads += [f"{env[n].name} = {hold[n]}[r]" for n in reloaded]
    for a in io.along_ins:
        env.setdefault(a.node, Value(kb.value_name(a.node), a.dtype))
    body = kb.body.emit(nodes, env)
    stores = [f"{io.ref_of[id(a)]} = {env[a.node].name}" for a in stored]
    kept = {n: view for n, view in hold.items() if n in nodes and plan.level[n] == p}
    stores += [f"{view}[r] = {env[n].name}" for n, view in kept.items()]
    return _row_pass(kb, schedule, plan.pass_accs(p), env, io.digit_lines + loads, body + stores,
                     {**io.direct, **kept})


def _task_loop(schedule: RowSchedule, buffers: list[str], task: list[str]) -> list[str]:
    """The loop over rows around one row's lines: with buffers, tasks of runs of rows that allocate them once.
    NOTE: an allocation per row cost more than a row of 64 values (softmax over 4096 rows: ~0.4 ms)."""
    if not buffers:
        return [f"for o in {schedule.loop}({schedule.n_outer}):"] + indent(task)
    per = schedule.rows_per_task
    return [f"for t in {schedule.loop}({schedule.tasks}):"] + indent(
        buffers + [f"for o in range(t * {per}, min({schedule.n_outer}, (t + 1) * {per})):"] + indent(task))


def _row_pass(kb: KernelBuilder, schedule: RowSchedule, accs, env, loads: list[str], work: list[str],
              direct: dict) -> list[str]:
    """One loop over the row: the per-element lines, accumulating `accs` (blocked through helpers when the
    schedule says so; a reduction of an input read contiguously along the row (`direct`: input node -> its row
    view) reduces the view's block itself, with no copy); then each reduction's value, cast to its dtype, joins
    `env`."""
    n_red = schedule.n_red
    per_element = loads + work
    if not accs:
        return [f"for r in range({n_red}):"] + indent(per_element)
    values = [env[a.source] for a in accs]
    lines = [f"{a.acc} = {a.identity}" for a in accs]
    if schedule.blocked:
        block = schedule.block
        lines += [f"for r0 in range(0, {n_red}, {block}):"]
        lines += indent([f"n = min({block}, {n_red} - r0)"])
        copied = [(a, v) for a, v in zip(accs, values) if a.source not in direct]
        if copied or work:
            lines += indent(["for q in range(n):"])
            lines += indent(["r = r0 + q"] + per_element + [f"{a.buf}[q] = {v.name}" for a, v in copied], 2)
        blocks = [f"{direct[a.source]}[r0:]" if a.source in direct else a.buf for a in accs]
        lines += indent([f"{a.acc} = {_combine(kb, a, a.acc, f'{_block_helper_of(kb, a)}({b}, n)')}"
                         for a, b in zip(accs, blocks)])
    else:
        lines += [f"for r in range({n_red}):"]
        lines += indent(per_element + [f"{a.acc} = {_combine(kb, a, a.acc, _acc_term(kb.dialect, v, a))}"
                                       for a, v in zip(accs, values)])
    for a in accs:
        env[a.node] = Value(kb.value_name(a.node), a.out_dtype)
        lines.append(f"{env[a.node].name} = {kb.dialect.cast(a.acc, a.out_dtype)}")
    return lines


def _row_addressing(arrays: list[Array], shape, kept, dims):
    """(per-row lines, element refs at reduced position r, indices of arrays constant along the row, per-element
    digit lines). When the reduced dims collapse to one run for every array, each array is read through a per-row
    slice at r * step (r >= 0 is provable, so the loop vectorizes); otherwise from the digits of r."""
    strides = [a.strides_in(shape) for a in arrays]  # a folded view (nnc.passes.views): its own strides
    _, o_offs = emit_offsets([shape[d] for d in kept], [[s[d] for d in kept] for s in strides], "o", "o_")
    o_offs = [shifted(oo, a.offset) for a, oo in zip(arrays, o_offs)]
    red_sizes, red_strides = collapse([shape[d] for d in dims], [[s[d] for d in dims] for s in strides])
    lines, refs, hoisted = [], [], set()
    if len(red_sizes) <= 1:
        views: dict[tuple, str] = {}  # (argument, row start) -> its row view (a base read through two views: two)
        for a, oo, st in zip(arrays, o_offs, red_strides):
            step = st[0] if st else 0
            if not step:
                refs.append(f"{a.arg}[{oo}]")
                hoisted.add(id(a))
                continue
            view = a.arg
            if oo != "0":
                view = views.get((a.arg, oo))
                if view is None:
                    view = f"row_{a.arg}" + (f"_{len(views)}" if any(k[0] == a.arg for k in views) else "")
                    views[(a.arg, oo)] = view
                    lines.append(f"{view} = {a.arg}[{oo}:]")
            refs.append(f"{view}[{'r' if step == 1 else f'r * {step}'}]")
        return lines, refs, hoisted, []
    digit_lines, r_offs = emit_offsets([shape[d] for d in dims], [[s[d] for d in dims] for s in strides], "r", "r_")
    bases: dict[str, str] = {}  # row start -> its variable (a base read through two views has two)
    for a, oo, ro in zip(arrays, o_offs, r_offs):
        if oo != "0" and ro != "0":
            if oo not in bases:
                bases[oo] = f"b{len(bases)}_{a.arg}"
                lines.append(f"{bases[oo]} = {oo}")
            oo = bases[oo]
        refs.append(f"{a.arg}[{' + '.join(t for t in (oo, ro) if t != '0') or '0'}]")
        if ro == "0":
            hoisted.add(id(a))
    return lines, refs, hoisted, digit_lines


def _unique(arrays: list[Array]) -> list[Array]:
    """The numba arguments: each array once (an array read and written in place keeps its last role)."""
    unique: dict[str, Array] = {}
    for a in arrays:
        unique.pop(a.arg, None)
        unique[a.arg] = a
    return list(unique.values())
