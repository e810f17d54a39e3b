"""Rewrites a generated prange function into a serial launcher and a task function (nnc.codegen.tasks says why).

    def k(in0, out0):                        def k(in0, out0, nnc_task):
        pad = np.empty(64, dtype=np.float32)     pad = np.empty(64, dtype=np.float32)
        c0 = np.float32(0.5)                     c0 = np.float32(0.5)
        for t in prange(512):          ->        run_tasks(nnc_task, np.int64(512), in0, out0, pad)
            <body>
        <epilogue>                               <epilogue>

                                             def k_task(nnc_lo, nnc_hi, nnc_addrs):
                                                 in0 = task_array(nnc_addrs, 0, np.float32)
                                                 out0 = ...; pad = ...
                                                 c0 = np.float32(0.5)
                                                 for t in range(np.uint64(nnc_lo), ...):
                                                     <body>
                                                 return 0

A prologue that only copies rows beside an output (a bias, nnc.codegen.cpu_elementwise.placed_row_lines) needs no
launcher either: the launch line makes those copies with nnc.codegen.tasks.placed_row (numpy) and calls run_tasks
itself, as for a loop with no prologue. A launcher is a numba function that calls run_tasks, whose parfor numba
links in and optimizes again: 0.2 s of compilation each.

The body may read the function's arrays, arrays the prologue allocates (np.empty/np.zeros of one dimension, and
basic slices of those), and constants the prologue computes from literals alone (repeated in the task). Anything
else keeps the prange (`split_tasks` returns None): a body that reads another prologue value, assigns a name the
prologue or the epilogue uses (a prange reduction), uses size symbols, or a function with other than one prange.
Pure text in, text out: nothing here imports numba.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

TASK_SUFFIX = "_task"
ADDRESS_ARG = "nnc_task"  # the launcher's extra argument: the task function's C address
_TASK_ARGS = ("nnc_lo", "nnc_hi", "nnc_addrs")
_PRANGE = re.compile(r"for (\w+) in prange\((.+)\):")
_SYMBOL_NAME = r"S\d+"  # a size symbol (nnc.symbolic)
_SYMBOL = re.compile(rf"\b{_SYMBOL_NAME}\b")
_TAKEN = re.compile(rf"\b({'|'.join(_TASK_ARGS + (ADDRESS_ARG,))})\b")  # names the two functions add
_SAFE_NAMES = frozenset({"np", "math"})  # names a repeated constant may use
_ALLOCATORS = frozenset({"empty", "zeros"})
PAGE = 4096  # bytes: a row placed beside an output sits at a fixed distance from it modulo this (cpu_elementwise._PAGE)
PLACED_SKEW = PAGE // 2  # that distance: half a page after the output's address (cpu_elementwise._PAGE says why)


# A row copied beside an output before the loop (nnc.codegen.cpu_elementwise.placed_row_lines, what it generates):
# view, its length + a page of padding, dtype, the output, the itemsize, the length, the row's argument.
_PLACED_ROW = re.compile(r"(\w+)_pad = np\.empty\((\d+), dtype=([\w.]+)\)\n"
                         rf"\1_at = np\.int64\(\((\w+)\.ctypes\.data \+ {PLACED_SKEW} - \1_pad\.ctypes\.data\) "
                         rf"% {PAGE}\) // (\d+)\n"
                         r"\1 = \1_pad\[\1_at:\1_at \+ (\d+)\]\n"
                         r"for c in range\(\6\):\n"
                         r"    \1\[c\] = (\w+)\[c\]")


@dataclass
class TaskSplit:
    """What a prange function becomes: the task function's body, and the launcher's (lines, unindented). A `direct`
    split has a task count of literals and size symbols, nothing after the loop and nothing before it but rows
    copied beside an output: its launch line calls run_tasks itself (`launch_tasks`), making those copies with
    nnc.codegen.tasks.placed_row (`placed`: (row argument, output argument, length), by argument position, in the
    order the task reads them after the arguments), so no launcher is compiled."""

    launcher: list[str]
    task: list[str]
    count: str
    direct: bool
    placed: list[tuple[int, int, int]] = field(default_factory=list)


def split_tasks(lines: list[str], arrays: list[tuple[str, str]], scalars: list[str] = ()) -> TaskSplit | None:
    """The launcher and task bodies for a function body `lines` whose array arguments are `arrays` ((name, dtype
    constructor such as np.float32) in order) and whose scalar arguments (size symbols) are `scalars`, or None when
    it keeps its prange (see the module doc)."""
    found = [i for i, line in enumerate(lines) if "prange(" in line]
    if len(found) != 1:
        return None
    head = _PRANGE.fullmatch(lines[found[0]])
    if head is None:
        return None
    start = found[0] + 1
    end = next((j for j in range(start, len(lines)) if lines[j] and not lines[j].startswith("    ")), len(lines))
    prologue, body, epilogue = lines[:found[0]], lines[start:end], lines[end:]
    scalar = re.compile(rf"\b({'|'.join([_SYMBOL_NAME] + [re.escape(s) for s in scalars])})\b")
    if not body or any(scalar.search(line) for line in body):
        return None
    if any(_TAKEN.search(line) for line in lines):
        return None
    parsed = _parse(prologue), _parse([line[4:] for line in body]), _parse(epilogue)
    if any(tree is None for tree in parsed):
        return None
    return _split(head.group(1), head.group(2), prologue, body, epilogue, parsed, dict(arrays))


def _split(var, count, prologue, body, epilogue, parsed, dtypes) -> TaskSplit | None:
    pro_tree, body_tree, epi_tree = parsed
    defined = _stored(pro_tree)
    body_stores = _stored(body_tree) | {var}
    if body_stores & (defined | (_loaded(epi_tree) - _stored(epi_tree)) | set(dtypes)):
        return None  # a reduction into a prologue value, a value the epilogue reads, or a rebound argument
    allocated = _prologue_arrays(pro_tree, dtypes)
    constants, own_arrays = [], {}
    for name in sorted(_loaded(body_tree) & defined, key=lambda n: _first_line(pro_tree, n)):
        statement = _only_assignment(pro_tree, name)
        if statement is None:
            return None
        if name in allocated:
            own_arrays[name] = allocated[name]
        elif _constant(statement.value):
            constants.append(ast.unparse(statement))
        else:
            return None
    handed = list(dtypes) + list(own_arrays)
    every = {**dtypes, **own_arrays}
    task = [f"{name} = task_array({_TASK_ARGS[2]}, {k}, {every[name]})" for k, name in enumerate(handed)]
    # NOTE: an unsigned loop index, as a parfor's: numba then indexes arrays with it without the negative-index
    # wraparound, which kept LLVM from vectorizing loops that index flat arrays with it (a gelu backward over
    # [8, 64, 256] took 580-810 us on two threads, 141 us so). Arithmetic mixing it with int64 values is int64.
    loop = f"for {var} in range(np.uint64({_TASK_ARGS[0]}), np.uint64({_TASK_ARGS[1]})):"
    task += constants + [loop] + body + ["return 0"]
    # NOTE: np.int64(...): a literal count would make numba compile run_tasks once per count
    launcher = prologue + [f"run_tasks({ADDRESS_ARG}, np.int64({count}), {', '.join(handed)})"] + epilogue
    placed = _placed_rows(prologue, list(dtypes), list(own_arrays))
    direct = (not epi_tree.body and (not pro_tree.body or placed is not None)
              and _loaded(ast.parse(count)) <= set(_SYMBOL.findall(count)))
    return TaskSplit(launcher=launcher, task=task, count=count, direct=direct, placed=(placed or []) if direct else [])


def _placed_rows(prologue: list[str], arguments: list[str], own_arrays: list[str]) -> list | None:
    """(row argument, output argument, length) of each row a prologue made of placed-row copies alone copies, in
    the order of `own_arrays` (the arrays the task reads besides the arguments); None for any other prologue."""
    text = "\n".join(prologue)
    rows, end = {}, 0
    for match in _PLACED_ROW.finditer(text):
        if text[end:match.start()].strip():
            return None
        view, _, _, like, _, length, row = match.groups()
        if like not in arguments or row not in arguments:
            return None
        rows[view] = (arguments.index(row), arguments.index(like), int(length))
        end = match.end()
    if not rows or text[end:].strip() or sorted(rows) != sorted(own_arrays):
        return None
    return [rows[view] for view in own_arrays]


def launch_tasks(launch: list[str], splits: dict[str, tuple[TaskSplit, int]]) -> list[str]:
    """Launch lines whose calls of split functions ({name: (its TaskSplit, its array argument count)}) run the
    tasks: a direct split's call becomes run_tasks(task address, count, its arrays...), any other's also passes the
    task's address to its launcher. The address is `nnc_address` of the task's dispatcher, set when
    nnc.codegen.cpu compiles it."""
    if not splits:
        return list(launch)
    return [_launch_line(line, splits) for line in launch]


class _TaskCalls(ast.NodeTransformer):
    def __init__(self, splits):
        self.splits = splits

    def visit_Call(self, node):
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Name) and node.func.id in self.splits):
            return node
        split, n_arrays = self.splits[node.func.id]
        address = ast.parse(f"{node.func.id}{TASK_SUFFIX}.nnc_address", mode="eval").body
        if not split.direct:
            return ast.Call(func=node.func, args=node.args + [address], keywords=node.keywords)
        placed = [ast.Call(func=ast.Name("placed_row", ast.Load()),
                           args=[node.args[row], node.args[like], ast.Constant(length)], keywords=[])
                  for row, like, length in split.placed]
        return ast.Call(func=ast.Name("run_tasks", ast.Load()),
                        args=[address, ast.parse(split.count, mode="eval").body] + node.args[:n_arrays] + placed,
                        keywords=[])


def _launch_line(line: str, splits: dict) -> str:
    if not any(f"{name}(" in line for name in splits):
        return line
    tree = _TaskCalls(splits).visit(ast.parse(line))
    return ast.unparse(ast.fix_missing_locations(tree))


def task_arguments() -> str:
    """The task function's parameters."""
    return ", ".join(_TASK_ARGS)


def _parse(lines: list[str]) -> ast.Module | None:
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _stored(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _loaded(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _first_line(tree: ast.Module, name: str) -> int:
    return min(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name)


def _only_assignment(tree: ast.Module, name: str) -> ast.Assign | None:
    """The prologue's one top-level `name = ...`, when nothing else there assigns `name`."""
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)]
    top = [s for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
           and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]
    return top[0] if len(stores) == 1 and len(top) == 1 else None


def _prologue_arrays(tree: ast.Module, arguments: dict[str, str]) -> dict[str, str]:
    """The 1-D arrays the prologue's top-level assignments make, with their dtype constructors (_array_dtype)."""
    known = dict(arguments)
    made = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0],
                                                                                              ast.Name):
            dtype = _array_dtype(statement.value, known)
            if dtype is not None:
                known[statement.targets[0].id] = made[statement.targets[0].id] = dtype
    return made


def _array_dtype(value: ast.expr, arrays: dict[str, str]) -> str | None:
    """The dtype constructor of a 1-D array `value` makes: np.empty/np.zeros(n, dtype=np.X), or a basic slice of a
    known array; None for anything else."""
    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Slice) and isinstance(value.value, ast.Name):
        return arrays.get(value.value.id)
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _ALLOCATORS
            and isinstance(value.func.value, ast.Name) and value.func.value.id == "np"):
        return None
    if len(value.args) != 1 or isinstance(value.args[0], (ast.Tuple, ast.List)):
        return None
    dtype = [k.value for k in value.keywords if k.arg == "dtype"]
    if len(dtype) != 1 or len(value.keywords) != 1 or not _constant(dtype[0]):
        return None
    return ast.unparse(dtype[0])


def _constant(value: ast.expr) -> bool:
    """Whether an expression uses no name but np and math (its value is the same wherever it is computed)."""
    return all(n.id in _SAFE_NAMES for n in ast.walk(value) if isinstance(n, ast.Name))
