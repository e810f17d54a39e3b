"""nnc.blas_threads: a BLAS kernel keeps the faster of OpenBLAS's own thread count and one thread, re-timing the
other now and then, and always gives the process its own count back."""
from __future__ import annotations

import pytest

import nnc
import runtime
from nnc import blas_threads
from runtime import nn


class FakeOpenBLAS:
    """A thread count to set, and a clock that advances by what a launch costs with the current count."""

    def __init__(self, default_threads=2):
        self.num_threads = self.default_threads = default_threads
        self.counts_seen, self.now = [], 0.0

    def set_num_threads(self, n):
        self.num_threads = n


@pytest.fixture
def fake(monkeypatch):
    lib = FakeOpenBLAS()
    monkeypatch.setattr(blas_threads, "openblas", lambda: lib)
    monkeypatch.setattr(blas_threads.time, "perf_counter", lambda: lib.now)
    return lib


def _launch(lib, cost):
    def launch():
        lib.counts_seen.append(lib.num_threads)
        lib.now += cost[lib.num_threads]
    return launch


@pytest.mark.parametrize("cost, single", [({1: 1.0, 2: 4.0}, True), ({1: 2.0, 2: 1.0}, False)])
def test_the_faster_count_is_kept_after_the_first_calls(fake, cost, single):
    choice = blas_threads.ThreadChoice()
    for _ in range(20):
        choice.run(_launch(fake, cost))
    assert fake.counts_seen[:6] == [2, 1, 2, 1, 2, 1]  # both counts timed first
    assert fake.counts_seen[6:] == [1 if single else 2] * 14
    assert choice.single is single and fake.num_threads == 2  # the process's own count is back after every call


def test_a_change_of_load_is_found_by_re_timing_the_other_count(fake):
    choice = blas_threads.ThreadChoice()
    cost = {1: 2.0, 2: 1.0}  # quiet: threads win
    for _ in range(64):
        choice.run(_launch(fake, cost))
    assert not choice.single
    cost.update({2: 30.0})   # other processes load the cores: the threads wait for them
    for _ in range(64 * 4):
        choice.run(_launch(fake, cost))
    assert choice.single


def test_an_error_in_a_launch_still_restores_the_count(fake):
    choice = blas_threads.ThreadChoice()
    choice.run(_launch(fake, {1: 1.0, 2: 1.0}))

    def failing():
        raise ValueError("boom")
    with pytest.raises(ValueError):
        choice.run(failing)  # the second call runs on one thread
    assert fake.num_threads == 2


def test_only_large_blas_products_get_a_choice(fake):
    big = nnc.compile(nn.Linear(512, 512))
    big(runtime.randn(64, 512))
    small = nnc.compile(nn.Linear(8, 8))
    small(runtime.randn(4, 8))

    def choices(compiled):
        return [getattr(s, "blas", None) for c in compiled.compilations for p in c.plans for s in p.steps]
    assert any(isinstance(c, blas_threads.ThreadChoice) for c in choices(big))  # 64 x 512 x 512 through BLAS
    assert not any(choices(small))
