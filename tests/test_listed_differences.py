"""The names issue 15 listed as present but behaving differently from torch: each call now gives torch's result."""
from __future__ import annotations

import pytest

import runtime
from helpers import needs_torch


def _sched_keys(L):
    opt = L.optim.SGD(L.nn.Linear(2, 2).parameters(), 0.1)
    return sorted(L.optim.lr_scheduler.StepLR(opt, 2).state_dict())


CASES = {
    "conv padding_mode reflect": lambda L: L.nn.Conv1d(1, 1, 3, padding=1, padding_mode="reflect")(
        L.ones(1, 1, 4)).shape[-1],
    "MultiheadAttention kdim/vdim": lambda L: tuple(L.nn.MultiheadAttention(4, 2, kdim=3, vdim=5)(
        L.ones(2, 1, 4), L.ones(3, 1, 3), L.ones(3, 1, 5))[0].shape),
    "cat with an empty 1-D tensor": lambda L: tuple(L.cat([L.ones(2, 3), L.tensor([])]).shape),
    "concatenate(axis=)": lambda L: tuple(L.concatenate([L.ones(2), L.ones(2)], axis=0).shape),
    "zeros(size=)": lambda L: tuple(L.zeros(size=(2, 3)).shape),
    "round(decimals=)": lambda L: L.round(L.tensor([1.2345], dtype=L.float64), decimals=2).tolist(),
    "take_along_dim without dim": lambda L: L.take_along_dim(L.tensor([[3.0, 1], [2, 4]]), L.tensor([0, 3])).tolist(),
    "where(cond)": lambda L: [x.tolist() for x in L.where(L.tensor([0, 1, 1]))],
    "div(rounding_mode='floor') keeps requires_grad": lambda L: L.div(L.ones(2, requires_grad=True), 3,
                                                                      rounding_mode="floor").requires_grad,
    "floor_divide keeps requires_grad": lambda L: L.floor_divide(L.ones(2, requires_grad=True), 3).requires_grad,
    "clamp_ with tensor bounds": lambda L: L.tensor([1.0, 5.0]).clamp_(L.tensor([2.0, 0.0]),
                                                                       L.tensor([3.0, 4.0])).tolist(),
    "div_(rounding_mode=)": lambda L: L.tensor([5.0, 7.0]).div_(2, rounding_mode="trunc").tolist(),
    "type()": lambda L: L.ones(2).type(),
    "view(dtype)": lambda L: L.ones(2).view(L.int32).tolist(),
    "dtype.is_signed": lambda L: (L.float32.is_signed, L.int64.is_signed, L.bool.is_signed),
    "Tensor.__hash__": lambda L: len({L.ones(1): 1, L.ones(1): 2}),
    "LRScheduler.state_dict keys": _sched_keys,
}


@needs_torch
@pytest.mark.parametrize("name", list(CASES))
def test_listed_difference_is_fixed(torch, name):
    assert CASES[name](runtime) == CASES[name](torch)
