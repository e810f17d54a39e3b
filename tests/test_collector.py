"""Compilations hold back the garbage collector's full passes (nnc/collector.py) and give the caller's thresholds
back; the compile helpers freeze numba's registries out of the collector's walk."""
import gc
import subprocess
import sys
import threading

import pytest

import nnc
import runtime
from nnc import collector, pipeline
from runtime import nn


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_full_passes_are_held_back_within_the_block_and_thresholds_come_back(thresholds):
    with collector.full_collections_deferred():
        young, middle, full = gc.get_threshold()
        assert (young, middle) == (700, 10) and full >= 1 << 30
        with collector.full_collections_deferred():
            assert gc.get_threshold()[2] >= 1 << 30
        assert gc.get_threshold()[2] >= 1 << 30, "an inner block must not end the outer one's deferral"
    assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_come_back_after_an_error(thresholds):
    with pytest.raises(ZeroDivisionError):
        with collector.full_collections_deferred():
            1 / 0
    assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_the_program_sets_within_the_block_are_kept(thresholds):
    with collector.full_collections_deferred():
        gc.set_threshold(5000, 20, 30)
    assert gc.get_threshold() == (5000, 20, 30)


def test_young_passes_still_run_within_the_block(thresholds):
    with collector.full_collections_deferred():
        before = gc.get_stats()[0]["collections"]
        for _ in range(20000):
            a = []
            a.append(a)  # a cycle: only the collector frees it
        assert gc.get_stats()[0]["collections"] > before


def test_overlapping_blocks_on_two_threads_restore_once_both_end(thresholds):
    entered, release = threading.Barrier(2), threading.Event()
    seen = []

    def compile_like():
        with collector.full_collections_deferred():
            entered.wait()
            release.wait()
        seen.append(gc.get_threshold()[2])

    other = threading.Thread(target=compile_like)
    other.start()
    with collector.full_collections_deferred():
        entered.wait()
    assert gc.get_threshold()[2] >= 1 << 30, "the other thread's compile is still running"
    release.set()
    other.join()
    assert gc.get_threshold() == (700, 10, 10) and seen == [10]


def test_every_stage_of_a_compilation_runs_without_full_passes(thresholds):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    during = []
    with pipeline.observing(lambda stage, c: during.append((stage, gc.get_threshold()[2]))):
        nnc.compile(model)(runtime.randn(3, 4)).sum().backward()
    assert [s for s, _ in during] == list(pipeline.STAGE_NAMES)
    assert all(full >= 1 << 30 for _, full in during), during
    assert gc.get_threshold() == (700, 10, 10)


def test_a_compile_helper_freezes_numbas_registries():
    code = ("import gc; from nnc.codegen import compile_workers as w; w._set_up_numba(); "
            "print(gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.strip()) > 100_000
