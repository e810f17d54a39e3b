"""DDP on N ranks with batch B each == one process with batch N*B, step by step (float64, to 1e-12).

Usage: mpiexec -n N python tests/mpi_workers/ddp_equivalence.py MODEL MODE [PROGRESS]
MODEL: mlp | cnn; MODE: eager | ddp_of_compiled (DDP(nnc.compile(m))) | compiled_ddp (nnc.compile(DDP(m)));
PROGRESS (eager only): hooks | thread, how DDP drives MPI during backward (default: DDP's choice).
Every rank also trains the single-process reference itself (eager), so it can compare locally."""
from __future__ import annotations

import sys
import warnings

import numpy as np

from common import dist, done, runtime, same_everywhere, start

rank, world = start()
model_kind, mode = sys.argv[1], sys.argv[2]
nn, F = runtime.nn, runtime.nn.functional
DDP = nn.parallel.DistributedDataParallel
B, STEPS, TOL = 4, 4, 1e-12


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3)
        self.head = nn.Linear(6 * 2 * 2, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.head(x.flatten(1))


def make(seed: int):
    runtime.manual_seed(seed)
    if model_kind == "mlp":
        return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 5))
    return SmallCNN()


def batch(step: int, r: int):
    rng = np.random.default_rng(10 * step + r)
    shape = (B, 8) if model_kind == "mlp" else (B, 1, 8, 8)
    return runtime.tensor(rng.standard_normal(shape)), runtime.tensor(rng.integers(0, 5, B))


runtime.set_default_dtype(runtime.float64)
reference = make(0)
model = make(rank)  # ranks start different: DDP must broadcast rank 0's parameters
if mode == "eager":
    ddp = DDP(model, bucket_cap_mb=0.001)  # tiny buckets: several all-reduces per backward
    if len(sys.argv) > 3:
        ddp.progress = sys.argv[3]
else:
    import nnc

    warnings.filterwarnings("error", message="nnc.compile")  # a fallback to eager would test nothing

    ddp = DDP(nnc.compile(model), bucket_cap_mb=0.001) if mode == "ddp_of_compiled" else nnc.compile(DDP(model))
assert len(getattr(ddp, "bucket_sizes", lambda: [0, 0])()) > 1 or mode == "compiled_ddp"
for p, q in zip(model.parameters(), reference.parameters()):
    assert np.array_equal(p.detach().numpy(), q.detach().numpy()), "parameters not broadcast from rank 0"
assert all(k.startswith("module.") for k in ddp.state_dict())
opt = runtime.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
ref_opt = runtime.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
for step in range(STEPS):
    xs, ys = zip(*(batch(step, r) for r in range(world)))
    ref_loss = F.cross_entropy(reference(runtime.cat(xs)), runtime.cat(ys))
    ref_opt.zero_grad()
    ref_loss.backward()
    ref_opt.step()

    loss = F.cross_entropy(ddp(xs[rank]), ys[rank])
    opt.zero_grad()
    loss.backward()
    opt.step()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
    assert abs(float(mean_loss) - float(ref_loss)) <= TOL, (step, float(mean_loss), float(ref_loss))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        err = np.abs(p.detach().numpy() - q.detach().numpy()).max()
        assert err <= TOL, f"step {step}: {name} differs from the single-process run by {err}"
        assert same_everywhere(p.detach().numpy()), f"step {step}: {name} differs between ranks"
done(f"ddp {model_kind} {mode}")
