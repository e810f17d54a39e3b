"""DDP.join on N ranks with inputs of different lengths: rank r trains on 3 + 2r batches; the job ends (nobody
waits forever) and equals one process that averages, at each step, the gradients of the ranks that had a batch,
divided by the initial world size or by the number of ranks still training (float64, to 1e-12)."""
from __future__ import annotations

import numpy as np

from common import done, runtime, same_everywhere, start

rank, world = start()
nn, F = runtime.nn, runtime.nn.functional
DDP = nn.parallel.DistributedDataParallel
runtime.set_default_dtype(runtime.float64)


def steps_of(r: int) -> int:
    return 3 + 2 * r


def batch(step: int, r: int):
    rng = np.random.default_rng(10 * step + r)
    return runtime.tensor(rng.standard_normal((4, 6))), runtime.tensor(rng.integers(0, 3, 4))


def make():
    runtime.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


for initial in (True, False):
    for cap in (None, 0.0001):
        model, reference = make(), make()
        ddp = DDP(model, bucket_cap_mb=cap)
        opt = runtime.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = runtime.optim.SGD(reference.parameters(), lr=0.1)
        with ddp.join(divide_by_initial_world_size=initial):
            for step in range(steps_of(rank)):
                x, y = batch(step, rank)
                opt.zero_grad()
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
        for step in range(steps_of(world - 1)):
            active = [r for r in range(world) if step < steps_of(r)]
            ref_opt.zero_grad()
            for r in active:  # (BatchNorm normalizes with each batch's statistics: the buffers do not matter)
                x, y = batch(step, r)
                (F.cross_entropy(reference(x), y) / (world if initial else len(active))).backward()
            ref_opt.step()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            err = np.abs(p.detach().numpy() - q.detach().numpy()).max()
            assert err <= 1e-12, f"join(divide_by_initial_world_size={initial}), {name}: off by {err}"
            assert same_everywhere(p.detach().numpy())

# throw_on_early_termination: every rank raises once one runs out
ddp = DDP(make())
try:
    with ddp.join(throw_on_early_termination=True):
        for step in range(steps_of(rank)):
            ddp(batch(step, rank)[0]).sum().backward()
except RuntimeError as exc:
    assert "exhausted inputs" in str(exc)
else:
    raise AssertionError("throw_on_early_termination should raise on every rank")
done("ddp join")
