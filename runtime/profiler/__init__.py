"""torch.profiler for runtime: `profile` records every eager op runtime runs (through runtime._profiling's observer
hook) and every `record_function` range, with their times, threads and (record_shapes) input shapes;
`key_averages().table()` prints torch's table, `export_chrome_trace` writes a trace for chrome://tracing or Perfetto,
and `schedule` with `step()` and `on_trace_ready` (`tensorboard_trace_handler`) profiles chosen steps of a loop.

Ops are runtime's primitives by their op-table names (`linear`, `relu`, `sum`); a backward's ops appear as the ops
its rules run. Only CPU activity exists: there is no CUDA timeline (ProfilerActivity.CUDA records nothing more).
"""
from __future__ import annotations

import contextlib
import enum
import functools
import gzip
import json
import os
import socket
import threading
import time
import warnings

from .. import _profiling

__all__ = ["ProfilerAction", "ProfilerActivity", "profile", "record_function", "schedule",
           "tensorboard_trace_handler"]


class ProfilerActivity(enum.Enum):
    CPU = 0
    CUDA = 1
    XPU = 2
    MTIA = 3


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0):
    """The action for each step number, as torch's: skip `skip_first` steps, then cycles of `wait` idle steps,
    `warmup` steps, and `active` recorded steps (the last of them saves); after `repeat` cycles (0: no limit),
    nothing."""
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise ValueError("Invalid profiler schedule arguments")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results", UserWarning, stacklevel=2)

    def action(step: int) -> ProfilerAction:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        cycle = wait + warmup + active
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        at = step % cycle
        if at < wait:
            return ProfilerAction.NONE
        if at < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if at < cycle - 1 else ProfilerAction.RECORD_AND_SAVE
    return action


class FunctionEvent:
    """One recorded op or range: times in microseconds from the profile's start."""

    def __init__(self, name: str, start_us: float, end_us: float, thread: int, input_shapes: list,
                 user_annotation: bool):
        self.name, self.key = name, name
        self.start_us, self.end_us = start_us, end_us
        self.thread, self.input_shapes = thread, input_shapes
        self.is_user_annotation = user_annotation
        self.cpu_children: list[FunctionEvent] = []
        self.cpu_parent: FunctionEvent | None = None
        self.count = 1

    @property
    def cpu_time_total(self) -> float:
        return self.end_us - self.start_us

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(child.cpu_time_total for child in self.cpu_children)

    def __repr__(self) -> str:
        return f"<FunctionEvent {self.name} cpu_time_total={self.cpu_time_total:.3f}us>"


class FunctionEventAvg:
    """Every event of one key (a name, and input shapes when grouped by them): counts and summed times."""

    def __init__(self, key: str, input_shapes):
        self.key, self.input_shapes = key, input_shapes
        self.count = 0
        self.cpu_time_total = self.self_cpu_time_total = 0.0
        self.is_user_annotation = False

    def add(self, event) -> "FunctionEventAvg":
        self.count += event.count
        self.cpu_time_total += event.cpu_time_total
        self.self_cpu_time_total += event.self_cpu_time_total
        self.is_user_annotation = event.is_user_annotation
        return self

    @property
    def cpu_time(self) -> float:
        """The average time of one call, in microseconds."""
        return self.cpu_time_total / self.count if self.count else 0.0

    def __repr__(self) -> str:
        return f"<FunctionEventAvg key={self.key} count={self.count} cpu_time_total={self.cpu_time_total:.3f}us>"


_SORT_KEYS = {"cpu_time", "cpu_time_total", "self_cpu_time_total", "count"}


class EventList(list):
    """Events (or their averages), with torch's table."""

    def key_averages(self, group_by_input_shape: bool = False) -> "EventList":
        groups: dict = {}
        for event in self:
            shapes = str(event.input_shapes) if group_by_input_shape else None
            avg = groups.get((event.key, shapes))
            if avg is None:
                avg = groups[(event.key, shapes)] = FunctionEventAvg(event.key, event.input_shapes
                                                                     if group_by_input_shape else None)
            avg.add(event)
        return EventList(groups.values())

    @property
    def self_cpu_time_total(self) -> float:
        return sum(e.self_cpu_time_total for e in self)

    def table(self, sort_by: str | None = None, row_limit: int = 100, max_name_column_width: int = 55,
              header: str | None = None, top_level_events_only: bool = False, **_ignored) -> str:
        """torch's table: name, self and total CPU time (with their shares of all self time), the average time
        of a call and the number of calls, sorted descending by `sort_by` (a column's attribute name)."""
        rows = [e for e in self if not top_level_events_only or getattr(e, "cpu_parent", None) is None]
        if sort_by is not None:
            if sort_by not in _SORT_KEYS:
                raise ValueError(f"sort_by must be one of {sorted(_SORT_KEYS)} for CPU events, got {sort_by!r}")
            rows = sorted(rows, key=lambda e: getattr(e, sort_by), reverse=True)
        if row_limit > 0:
            rows = rows[:row_limit]
        total = self.self_cpu_time_total or 1.0
        shapes = any(getattr(e, "input_shapes", None) for e in rows)
        names = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"]
        names += ["Input Shapes"] if shapes else []
        width = min(max([len(e.key) for e in rows] + [4]), max_name_column_width)
        widths = [width] + [12] * 6 + ([40] if shapes else [])
        line = "  ".join("-" * w for w in widths)

        def fmt(cells):
            return "  ".join(str(c)[:w].rjust(w) for c, w in zip(cells, widths))
        out = ([header] if header else []) + [line, fmt(names), line]
        for e in rows:
            cells = [e.key, f"{100 * e.self_cpu_time_total / total:.2f}%", _time(e.self_cpu_time_total),
                     f"{100 * e.cpu_time_total / total:.2f}%", _time(e.cpu_time_total), _time(e.cpu_time),
                     e.count]
            out.append(fmt(cells + ([str(e.input_shapes or "")] if shapes else [])))
        out += [line, f"Self CPU time total: {_time(self.self_cpu_time_total)}", ""]
        return "\n".join(out)


def _time(us: float) -> str:
    """torch's spelling of a time: 12.345us, 1.234ms or 1.234s."""
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


# What the running profilers record into: one at a time, as torch allows (a second raises).
_active: list = []


class record_function(contextlib.ContextDecorator):
    """A named range of a recording profile (its ops nest under it in the table's self times): a context
    manager or a decorator; free when no profile records."""

    def __init__(self, name: str, args: str | None = None):
        self.name = name
        self._start = None

    def __enter__(self):
        self._start = time.perf_counter() if _active else None
        return self

    def __exit__(self, *exc):
        if self._start is not None and _active:
            _active[0]._record(self.name, self._start, time.perf_counter(), [], user_annotation=True)
        return False


class profile:
    """torch.profiler.profile: records runtime's ops and record_function ranges between start and stop (or the
    steps a `schedule` marks), then `key_averages()`, `events()` and `export_chrome_trace` report them."""

    def __init__(self, activities=None, schedule=None, on_trace_ready=None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config=None, use_cuda=None, **_ignored):
        self.activities = set(activities or [ProfilerActivity.CPU])
        self.schedule, self.on_trace_ready = schedule, on_trace_ready
        self.record_shapes = record_shapes
        self.step_num = 0
        self._events: list[FunctionEvent] = []
        self._recording = False
        self._origin = time.perf_counter()
        self._step_start = None

    # -- recording ---------------------------------------------------------------------------------

    def _observe(self, op, arrays, out, start, end, inplace) -> None:
        shapes = [list(getattr(a, "shape", ())) if a is not None else [] for a in arrays] if self.record_shapes else []
        self._record(op.name, start, end, shapes)

    def _record(self, name, start, end, shapes, user_annotation=False) -> None:
        self._events.append(FunctionEvent(name, (start - self._origin) * 1e6, (end - self._origin) * 1e6,
                                          threading.get_ident(), shapes, user_annotation))

    def _start_recording(self) -> None:
        if self._recording:
            return
        if _active and _active[0] is not self:
            raise RuntimeError("Profiler is already enabled on this thread")
        _active.append(self)
        _profiling.op_observers.append(self._observe)
        self._recording = True
        self._step_start = time.perf_counter() if self.schedule is not None else None

    def _stop_recording(self) -> None:
        if not self._recording:
            return
        self._close_step()
        _profiling.op_observers.remove(self._observe)
        _active.remove(self)
        self._recording = False

    def _close_step(self) -> None:
        if self._step_start is not None:
            self._record(f"ProfilerStep#{self.step_num}", self._step_start, time.perf_counter(), [],
                         user_annotation=True)
            self._step_start = None

    def _action(self) -> ProfilerAction:
        return self.schedule(self.step_num) if self.schedule is not None else ProfilerAction.RECORD

    # -- torch's interface -------------------------------------------------------------------------

    def start(self) -> None:
        if self._action() in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._start_recording()

    def stop(self) -> None:
        was_recording = self._recording
        self._stop_recording()
        if was_recording and self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def step(self) -> None:
        """The end of a step of the profiled loop: a schedule's saving step hands its trace to on_trace_ready."""
        previous = self._action()
        self._close_step()
        self.step_num += 1
        current = self._action()
        if previous == ProfilerAction.RECORD_AND_SAVE:
            self._stop_recording()
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)
            self._events = []
        if current in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            if self._recording:
                self._step_start = time.perf_counter()
            else:
                self._start_recording()
        elif self._recording:
            self._stop_recording()

    def __enter__(self) -> "profile":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def events(self) -> EventList:
        """Every recorded event, each op nested under the record_function ranges that enclose it on its thread."""
        events = sorted(self._events, key=lambda e: (e.thread, e.start_us, -e.end_us))
        for e in events:
            e.cpu_children, e.cpu_parent = [], None
        open_ranges: list[FunctionEvent] = []
        for e in events:
            while open_ranges and (open_ranges[-1].thread != e.thread or open_ranges[-1].end_us <= e.start_us):
                open_ranges.pop()
            if open_ranges:
                e.cpu_parent = open_ranges[-1]
                open_ranges[-1].cpu_children.append(e)
            open_ranges.append(e)
        return EventList(events)

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> EventList:
        return self.events().key_averages(group_by_input_shape)

    def export_chrome_trace(self, path: str) -> None:
        """The events as Chrome trace JSON (chrome://tracing, Perfetto); a path ending .gz is gzipped."""
        pid = os.getpid()
        trace = {"traceEvents": [{"name": e.name, "ph": "X", "cat": "user_annotation" if e.is_user_annotation
                                  else "cpu_op", "ts": e.start_us, "dur": e.cpu_time_total, "pid": pid,
                                  "tid": e.thread, "args": {"Input Dims": e.input_shapes} if e.input_shapes else {}}
                                 for e in self.events()],
                 "displayTimeUnit": "ms"}
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "wt") as f:
            json.dump(trace, f)


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None, use_gzip: bool = False):
    """An on_trace_ready that writes each trace into `dir_name` as <worker>.<time in ms>.pt.trace.json[.gz], the
    names TensorBoard's profiler plugin reads."""
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"

    @functools.wraps(tensorboard_trace_handler)
    def handler(prof: profile) -> None:
        os.makedirs(dir_name, exist_ok=True)
        name = f"{worker}.{time.time_ns() // 1_000_000}.pt.trace.json" + (".gz" if use_gzip else "")
        prof.export_chrome_trace(os.path.join(dir_name, name))
    return handler
