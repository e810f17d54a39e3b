"""`nnc.profile()`: time every kernel launch, eager op and interpreted step; a key-averages table and a Chrome trace.

    with nnc.profile() as prof:
        loss = compiled(x).sum(); loss.backward()
    print(prof.table(sort_by="total"))
    prof.export_chrome_trace("trace.json")     # open in https://ui.perfetto.dev or chrome://tracing

What is recorded, each as an event with a start, a duration, the bytes it read and wrote, and the thread it ran on:
  - "graph": one run of a compiled graph's plan (nnc.executor.Plan.run), its steps nested inside it;
  - "kernel": a generated kernel (KernelStep), or a whole graph run as one numba function ("whole_graph");
  - "view" and "interpreted": a plan step that is a numpy view, or nodes run by the interpreter (their eager ops
    nest inside);
  - "op": an eager op (runtime's Tensor._apply_op, through the hook point runtime._profiling); "op_" is its
    in-place form;
  - "compile": a stage of nnc.pipeline, when a compile happens inside the block;
  - "user": a range named with `prof.record("name")`.
Bytes are the sizes of the arrays a kernel or op reads plus those it writes (a view's are 0): what it must move at
least, so bytes / time is its achieved bandwidth (GB/s, 1e9 bytes a second).

Nothing is instrumented while no profile is on: the executor's step loop and runtime's op dispatch each test one
empty list (`ACTIVE` here, `runtime._profiling.op_observers`).
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass

from runtime import _profiling

# The profiles that are on (nnc.executor.Plan.run tests this list, and profiles its steps only when it is non-empty)
ACTIVE: list["profile"] = []

_perf_counter = time.perf_counter


@dataclass
class Event:
    name: str
    cat: str          # graph, kernel, whole_graph, view, interpreted, op, op_, compile, user
    start: float      # time.perf_counter() seconds
    end: float
    nbytes: int       # bytes read + written
    tid: int          # threading.get_ident()
    args: dict | None = None
    source: object = None  # what ran: the Kernel of a plan step, the Plan of a graph or whole-graph run, the OpDef

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Row:
    """One line of the key-averages table: every event with this (name, category)."""

    name: str
    cat: str
    calls: int = 0
    total: float = 0.0     # seconds, children included
    self: float = 0.0      # seconds, nested events' time excluded
    nbytes: int = 0

    @property
    def mean(self) -> float:
        return self.total / self.calls if self.calls else 0.0

    @property
    def gbps(self) -> float | None:
        """Achieved bandwidth: bytes moved over the time they took (None for rows that move none)."""
        return self.nbytes / self.total / 1e9 if self.nbytes and self.total > 0 else None


def _nbytes(value) -> int:
    return getattr(value, "nbytes", 0) or 0


class profile:
    """A context manager recording what runs inside it (see the module's docstring); reusable, not reentrant."""

    def __init__(self, record_ops: bool = True, record_steps: bool = True, record_compile: bool = True):
        self.record_ops, self.record_steps, self.record_compile = record_ops, record_steps, record_compile
        self.events: list[Event] = []
        self.started = self.stopped = 0.0
        self._exit: contextlib.ExitStack | None = None

    # -- recording ------------------------------------------------------------------------------------------

    def __enter__(self) -> "profile":
        from .pipeline import observing

        self.started = _perf_counter()
        stack = contextlib.ExitStack()
        if self.record_ops:
            _profiling.op_observers.append(self._op)
            stack.callback(_profiling.op_observers.remove, self._op)
        if self.record_steps:
            ACTIVE.append(self)
            stack.callback(ACTIVE.remove, self)
        if self.record_compile:
            stack.enter_context(observing(self._stage))
        self._exit = stack
        return self

    def __exit__(self, *exc) -> None:
        self.stopped = _perf_counter()
        stack, self._exit = self._exit, None
        if stack is not None:
            stack.close()

    def _op(self, op, arrays, out, start, end, inplace) -> None:
        """runtime._profiling's observer: one eager op."""
        if inplace:
            nbytes = sum(map(_nbytes, arrays)) + _nbytes(out)
        elif op.is_view:
            nbytes = 0
        else:
            nbytes = sum(map(_nbytes, arrays)) + _nbytes(out)
        shapes = [list(a.shape) if hasattr(a, "shape") else a for a in arrays[:4]]
        self.events.append(Event(op.name + ("_" if inplace else ""), "op_" if inplace else "op", start, end, nbytes,
                                 threading.get_ident(), {"kind": str(getattr(op.kind, "value", op.kind)),
                                                         "shapes": repr(shapes)}, op))

    def _stage(self, stage: str, compilation) -> None:
        """nnc.pipeline's observer: a stage just finished; its duration is in compilation.seconds."""
        end = _perf_counter()
        seconds = compilation.seconds.get(stage, 0.0)
        self.events.append(Event(f"stage {stage}", "compile", end - seconds, end, 0, threading.get_ident(),
                                 {"module": type(compilation.module).__name__}))

    def step(self, name: str, cat: str, start: float, end: float, nbytes: int, args: dict | None, source) -> None:
        """The executor's report of one plan step or plan run."""
        self.events.append(Event(name, cat, start, end, nbytes, threading.get_ident(), args, source))

    @contextlib.contextmanager
    def record(self, name: str):
        """A named range of the user's own (a "user" event): `with prof.record("forward"): ...`; recorded only while
        the profile is on."""
        start = _perf_counter()
        try:
            yield
        finally:
            if self._exit is not None:  # only while the profile is on
                self.events.append(Event(name, "user", start, _perf_counter(), 0, threading.get_ident()))

    # -- results --------------------------------------------------------------------------------------------

    def self_times(self) -> list[float]:
        """Each event's own time: its duration less that of the events nested in it (on the same thread)."""
        own = [e.seconds for e in self.events]
        by_thread: dict[int, list[int]] = {}
        for i, e in enumerate(self.events):
            by_thread.setdefault(e.tid, []).append(i)
        for indices in by_thread.values():
            indices.sort(key=lambda i: (self.events[i].start, -self.events[i].end))
            stack: list[int] = []
            for i in indices:
                e = self.events[i]
                while stack and self.events[stack[-1]].end <= e.start:
                    stack.pop()
                if stack:
                    own[stack[-1]] -= e.seconds
                stack.append(i)
        return own

    def key_averages(self) -> list[Row]:
        """One Row per (name, category), in first-seen order."""
        rows: dict[tuple, Row] = {}
        for event, own in zip(self.events, self.self_times()):
            row = rows.get((event.name, event.cat))
            if row is None:
                row = rows[(event.name, event.cat)] = Row(event.name, event.cat)
            row.calls += 1
            row.total += event.seconds
            row.self += max(own, 0.0)
            row.nbytes += event.nbytes
        return list(rows.values())

    SORT_KEYS = {"total": lambda r: -r.total, "self": lambda r: -r.self, "calls": lambda r: -r.calls,
                 "mean": lambda r: -r.mean, "bytes": lambda r: -r.nbytes, "gbps": lambda r: -(r.gbps or 0.0),
                 "name": lambda r: r.name}

    def table(self, sort_by: str = "total", row_limit: int | None = 40, cats: tuple | None = None) -> str:
        """A key-averages table as torch.profiler prints it: one line per (name, kind), sorted by `sort_by`
        (total, self, calls, mean, bytes, gbps or name). `% total` is a row's own time over the profiled time that
        some event covers; `cats` keeps only those categories."""
        if sort_by not in self.SORT_KEYS:
            raise ValueError(f"sort_by must be one of {', '.join(self.SORT_KEYS)}, not {sort_by!r}")
        rows = self.key_averages()
        covered = sum(r.self for r in rows) or 1.0
        if cats is not None:
            rows = [r for r in rows if r.cat in cats]
        rows.sort(key=self.SORT_KEYS[sort_by])
        shown = rows if row_limit is None else rows[:row_limit]
        header = ("Name", "Kind", "Calls", "Self ms", "Self %", "Total ms", "Mean us", "Bytes", "GB/s")
        lines = [[r.name, r.cat, str(r.calls), f"{r.self * 1e3:.3f}", f"{100 * r.self / covered:.1f}%",
                  f"{r.total * 1e3:.3f}", f"{r.mean * 1e6:.1f}", _fmt_bytes(r.nbytes) if r.nbytes else "",
                  f"{r.gbps:.2f}" if r.gbps is not None else ""] for r in shown]
        widths = [max(len(header[i]), *(len(line[i]) for line in lines)) if lines else len(header[i])
                  for i in range(len(header))]
        widths[0] = min(widths[0], 48)

        def fmt(cells):
            first = cells[0] if len(cells[0]) <= widths[0] else cells[0][:widths[0] - 3] + "..."
            return "  ".join([first.ljust(widths[0]), cells[1].ljust(widths[1])] +
                             [c.rjust(w) for c, w in zip(cells[2:], widths[2:])])

        rule = "-" * len(fmt(list(header)))
        out = [rule, fmt(list(header)), rule, *map(fmt, lines), rule]
        wall = (self.stopped or _perf_counter()) - self.started
        more = f"; {len(rows) - len(shown)} more rows" if len(shown) < len(rows) else ""
        out.append(f"Self time covered by events: {covered * 1e3:.3f} ms of {wall * 1e3:.3f} ms profiled; "
                   f"{len(self.events)} events{more}")
        return "\n".join(out)

    def chrome_trace(self) -> dict:
        """The events as Chrome's trace-event format (what Perfetto and chrome://tracing open): complete ("X")
        events, times in microseconds from the profile's start."""
        pid = os.getpid()
        tids: dict[int, int] = {}
        events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "nnc"}}]
        for e in sorted(self.events, key=lambda e: (e.start, -e.end)):
            tid = tids.setdefault(e.tid, len(tids))
            args = dict(e.args or {})
            if e.nbytes:
                args["bytes"] = e.nbytes
                if e.seconds > 0:
                    args["GB/s"] = round(e.nbytes / e.seconds / 1e9, 3)
            events.append({"name": e.name, "cat": e.cat, "ph": "X", "ts": round((e.start - self.started) * 1e6, 3),
                           "dur": round(e.seconds * 1e6, 3), "pid": pid, "tid": tid, "args": args})
        for ident, tid in tids.items():
            name = "main" if ident == threading.main_thread().ident else f"thread {ident}"
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str) -> None:
        """Write chrome_trace() as JSON to `path`."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- the executor's side: called from nnc.executor.Plan while ACTIVE is non-empty ---------------------------------


def _tensor_bytes(env: dict, nodes) -> int:
    return sum(_nbytes(getattr(env.get(n), "_data", None)) for n in nodes)


def run_steps(plan, steps: list, buffers: list, env: dict) -> None:
    """Plan.run's step loop, each step timed and reported to every active profile."""
    from .executor import KernelStep  # NOTE: here, since the executor imports this module

    graph = plan.gm._get_name()
    began = _perf_counter()
    for step, buffer, kernel in zip(steps, buffers, plan.kernels):
        start = _perf_counter()
        step.run(env, buffer)
        end = _perf_counter()
        if type(step).__name__.endswith("ViewStep"):  # a numpy view, or a device view on CUDA
            cat, nbytes = "view", 0
        else:
            cat = "kernel" if isinstance(step, KernelStep) else "interpreted"
            nbytes = _tensor_bytes(env, kernel.inputs) + _tensor_bytes(env, kernel.outputs)
        args = {"graph": graph, "kernel_kind": kernel.kind, "ops": ", ".join(kernel.meta.get("ops") or ())[:200]}
        if cat == "interpreted":
            args["reason"] = getattr(step, "reason", "")
        for prof in ACTIVE:
            prof.step(f"{graph}.{kernel.name}", cat, start, end, nbytes, args, kernel)
    end = _perf_counter()
    for prof in ACTIVE:
        prof.step(graph, "graph", began, end, 0, {"steps": len(steps)}, plan)


def run_whole(plan, step, arrays: list) -> dict:
    """A whole-graph step (one numba function), timed and reported."""
    start = _perf_counter()
    env = step.run(arrays)
    end = _perf_counter()
    graph = plan.gm._get_name()
    nbytes = sum(map(_nbytes, arrays)) + sum(_nbytes(t._data) for t in env.values())
    for prof in ACTIVE:
        prof.step(f"{graph} (whole graph)", "whole_graph", start, end, nbytes,
                  {"graph": graph, "kernels": len(plan.kernels)}, plan)
    return env
