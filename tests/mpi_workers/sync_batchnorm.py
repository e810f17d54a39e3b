"""SyncBatchNorm under DDP on N ranks with batch B each == BatchNorm in one process with batch N*B: losses,
parameters and running statistics after every step (float64, 1e-12), and the distributed.nn all_reduce's gradient.

Usage: mpiexec -n N python tests/mpi_workers/sync_batchnorm.py"""
from __future__ import annotations

import numpy as np

from common import done, runtime, start

rank, world = start()
nn, F = runtime.nn, runtime.nn.functional
B, STEPS, TOL = 3, 3, 1e-12
runtime.set_default_dtype(runtime.float64)


def make():
    runtime.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5),
                         nn.BatchNorm1d(5, momentum=None))


def batch(step: int, r: int):
    rng = np.random.default_rng(10 * step + r)
    return runtime.tensor(rng.standard_normal((B, 2, 6, 6))) * (r + 1), runtime.tensor(rng.integers(0, 5, B))


reference = make()
model = nn.SyncBatchNorm.convert_sync_batchnorm(make())
assert sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules()) == 2
ddp = nn.parallel.DistributedDataParallel(model)
opt, ref_opt = (runtime.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ddp, reference))
for step in range(STEPS):
    x, y = batch(step, rank)
    opt.zero_grad()
    loss = F.cross_entropy(ddp(x), y)
    loss.backward()
    opt.step()
    parts = [batch(step, r) for r in range(world)]
    whole_x, whole_y = runtime.cat([p[0] for p in parts]), runtime.cat([p[1] for p in parts])
    ref_opt.zero_grad()
    F.cross_entropy(reference(whole_x), whole_y).backward()
    ref_opt.step()
    for (name, got), want in zip(model.state_dict().items(), reference.state_dict().values()):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=TOL, atol=TOL, err_msg=f"step {step}: {name}")

from runtime.distributed.nn.functional import all_reduce  # noqa: E402

v = runtime.tensor([1.0, 2.0], requires_grad=True)
(all_reduce(v * (rank + 1)) * (rank + 1)).sum().backward()  # d/dv_r of sum_s (s+1) * sum_t (t+1) v_t
expected = (rank + 1) * sum(s + 1 for s in range(world))
np.testing.assert_allclose(v.grad.numpy(), [expected, expected], rtol=TOL)
done("sync_batchnorm")
