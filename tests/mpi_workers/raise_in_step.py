"""A rank that raises inside a DDP step must not hang the others: the library's excepthook aborts the job.

Rank 1 fails in its forward; rank 0 goes on into backward, where its gradients wait for rank 1's all-reduce."""
from __future__ import annotations

from common import runtime, start

rank, world = start()
nn = runtime.nn


class Fails(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        if rank == 1:
            raise ValueError("rank 1 fails in its forward")
        return self.lin(x)


ddp = nn.parallel.DistributedDataParallel(Fails())
ddp(runtime.randn(3, 4)).sum().backward()
print("UNREACHABLE rank", rank, flush=True)
