"""Tensor.share_memory_ / Module.share_memory and runtime.multiprocessing (torch.multiprocessing): values shared with
forked and spawned processes are the same memory (Hogwild training changes the parent's model), tensors not shared
travel as copies, spawn reports a failing process's traceback, and a segment goes away with its last tensor."""
from __future__ import annotations

import gc
from multiprocessing import shared_memory

import numpy as np
import pytest

import runtime
import runtime.multiprocessing as mp
import runtime.nn as nn
import runtime.nn.functional as F
from runtime import _shared_memory

import shared_memory_workers as workers

TIMEOUT = 120


def _run(context, target, args):
    process = context.Process(target=target, args=args)
    process.start()
    process.join(TIMEOUT)
    assert process.exitcode == 0, f"exit code {process.exitcode}"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_in_place_writes_in_a_child_reach_the_parent_only_for_shared_tensors(start_method):
    context = mp.get_context(start_method)
    shared = runtime.zeros(2).share_memory_()
    copied = runtime.zeros(3)
    assert shared.is_shared() and not copied.is_shared()
    _run(context, workers.add_to_my_slot, (1, shared, copied, 5))
    np.testing.assert_array_equal(shared.numpy(), [0.0, 5.0])
    np.testing.assert_array_equal(copied.numpy(), [0.0, 0.0, 0.0])  # a copy travelled


def test_hogwild_training_in_spawned_processes_trains_the_parents_model():
    runtime.manual_seed(0)
    model = nn.Linear(4, 1).share_memory()
    x = runtime.randn(32, 4)
    y = x @ runtime.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 1.0
    before = F.mse_loss(model(x), y).item()
    processes = [mp.get_context("spawn").Process(target=workers.train_shared_model, args=(rank, model, x, y, 30))
                 for rank in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(TIMEOUT)
        assert p.exitcode == 0
    after = F.mse_loss(model(x), y).item()
    assert after < 0.1 * before, (before, after)


def test_a_parameter_arrives_shared_and_a_parameter():
    model = nn.Linear(3, 2).share_memory()
    queue = mp.get_context("spawn").SimpleQueue()
    _run(mp.get_context("spawn"), workers.report_sharing, (0, model, queue))
    *shared, total = queue.get()
    assert shared == [True, True]
    assert total == pytest.approx(float(model.weight.detach().numpy().sum()), rel=1e-6)


def test_spawn_raises_a_childs_error_with_its_traceback():
    with pytest.raises(mp.ProcessRaisedException, match="ValueError: process 1 was told to fail"):
        mp.spawn(workers.fail_on, args=(1,), nprocs=2)
    mp.spawn(workers.fail_on, args=(5,), nprocs=2)  # nobody fails: returns


def test_views_and_cuda_rules():
    base = runtime.arange(6.0)
    with pytest.raises(RuntimeError, match="view"):
        base[2:].share_memory_()
    assert base.share_memory_() is base and base.is_shared()
    assert base.share_memory_() is base  # already shared: nothing moves
    np.testing.assert_array_equal(base.numpy(), np.arange(6.0))


def test_a_segment_is_unlinked_when_its_last_tensor_is_freed():
    t = runtime.ones(4).share_memory_()
    name, offset = _shared_memory.find(t._data)
    assert offset == 0
    shared_memory.SharedMemory(name=name).close()  # it exists
    del t
    gc.collect()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)
