"""Process targets for tests/test_shared_memory.py (a module of their own: spawned processes import it)."""
from __future__ import annotations

import numpy as np

import runtime
import runtime.nn.functional as F


def add_to_my_slot(rank: int, shared, copied, times: int) -> None:
    """shared[rank] += 1 `times` times in place; copied (sent by value) is changed too, but only here."""
    for _ in range(times):
        shared[rank] += 1.0
    copied += 100.0


def train_shared_model(rank: int, model, x, y, steps: int) -> None:
    """Hogwild: SGD steps on the shared model, each process on its half of the data."""
    optimizer = runtime.optim.SGD(model.parameters(), lr=0.1)
    half = slice(rank * 16, (rank + 1) * 16)
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(x[half]), y[half]).backward()
        optimizer.step()


def fail_on(rank: int, bad_rank: int) -> None:
    if rank == bad_rank:
        raise ValueError(f"process {rank} was told to fail")


def report_sharing(rank: int, model, queue) -> None:
    queue.put([bool(p.is_shared()) for p in model.parameters()] + [float(np.sum(model.weight.detach().numpy()))])
