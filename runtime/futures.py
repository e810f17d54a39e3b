"""runtime.futures: torch.futures.Future, the result of an asynchronous operation (a Work, a DDP comm hook).

There is no background executor: a Future made from a Work completes when it is waited for (or found done), and a
callback given to `then` runs at that moment, in the thread that waits."""
from __future__ import annotations

__all__ = ["Future", "collect_all", "wait_all"]


class Future:
    """A value that will be there: wait() blocks until it is and returns it; then(fn) chains fn(this future)."""

    def __init__(self, *, devices=None):
        self._done = False
        self._value = None
        self._exception = None
        self._complete = None  # completes this future when called (set by a Work, or by then)
        self._poll = None  # True when the operation behind this future has finished (without blocking)
        self._callbacks = []

    def _finish(self) -> None:
        if self._done:
            return
        complete, self._complete = self._complete, None
        if complete is None:
            raise RuntimeError("Future: wait() on a future that nothing will complete (call set_result first)")
        try:
            self._value = complete()
        except Exception as exc:  # stored, raised by wait() and value(), as torch
            self._exception = exc
        self._done = True
        self._run_callbacks()

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def wait(self):
        self._finish()
        if self._exception is not None:
            raise self._exception
        return self._value

    def value(self):
        if not self.done():
            raise RuntimeError("Future.value() called before the future completed (call wait())")
        return self.wait()

    def done(self) -> bool:
        if not self._done and self._complete is not None and (self._poll is None or self._poll()):
            self._finish()
        return self._done

    def set_result(self, result) -> None:
        if self._done:
            raise RuntimeError("Future: the result was already set")
        self._complete = None
        self._value, self._done = result, True
        self._run_callbacks()

    def set_exception(self, exception) -> None:
        self._complete = None
        self._exception, self._done = exception, True
        self._run_callbacks()

    def then(self, callback) -> "Future":
        """A future of callback(self), run once this one completes."""
        child = Future()
        child._parent = self
        child._complete = lambda: (self.wait(), callback(self))[1]
        child._poll = self.done
        return child

    def add_done_callback(self, callback) -> None:
        """Run callback(self) when this future completes (now, if it has)."""
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)


def collect_all(futures) -> Future:
    """A future of the list of `futures`, done when all are."""
    out = Future()
    futures = list(futures)

    def complete():
        for f in futures:
            f.wait()
        return futures
    out._complete = complete
    out._poll = lambda: all(f.done() for f in futures)
    return out


def wait_all(futures) -> list:
    return [f.wait() for f in futures]
