"""Data-parallel training on MPI: every rank trains on its own shard, DDP averages the gradients.

    mpiexec -n 2 python examples/train_ddp.py              # 2 processes on this machine
    mpiexec -n 4 python examples/train_ddp.py --compile    # each rank runs the model compiled by nnc
    python examples/train_ddp.py                           # also runs alone (a world of 1)

torch code (`import runtime as torch`): init_process_group, a DistributedSampler per rank, DistributedDataParallel
around the model, and an all_reduce to report the mean loss. Needs `pip install mpi4py mpich` (the `distributed`
extra). Across machines: `mpiexec -n 8 -f hostfile python examples/train_ddp.py` (see docs/distributed.md).
"""
import argparse
import math

import runtime as torch
import runtime.distributed as dist
from runtime import nn
from runtime.nn.parallel import DistributedDataParallel as DDP
from runtime.utils.data import DataLoader, DistributedSampler, TensorDataset


def spirals(n: int, generator) -> TensorDataset:
    """Points of three interleaved spirals and their arm (the same data on every rank: same generator seed)."""
    arm = torch.randint(0, 3, (n,), generator=generator)
    t = torch.rand(n, generator=generator) * 3 + 0.3
    angle = t * 2.5 + arm.float() * (2 * math.pi / 3)
    x = torch.stack([t * angle.cos(), t * angle.sin()], 1) + torch.randn(n, 2, generator=generator) * 0.05
    return TensorDataset(x, arm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--compile", action="store_true", help="wrap nnc.compile(model) in DDP")
    args = parser.parse_args()

    dist.init_process_group(backend="mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = spirals(3000, torch.Generator().manual_seed(0))
    sampler = DistributedSampler(data, shuffle=True, seed=0)  # rank and world size from the process group
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    torch.manual_seed(rank)  # ranks start different on purpose: DDP broadcasts rank 0's parameters
    model = nn.Sequential(nn.Linear(2, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 3))
    if args.compile:
        import nnc

        model = nnc.compile(model)
    model = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        total, batches = torch.zeros(()), 0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # gradients are averaged over the ranks during this call
            optimizer.step()
            total += loss.detach()
            batches += 1
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"epoch {epoch}: mean loss {float(total) / batches:.4f} over {world} rank(s), "
                  f"{batches * args.batch_size} samples per rank")
    if rank == 0:
        torch.save(model.module.state_dict(), "/tmp/train_ddp.pt")  # the plain model's keys, without "module."
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
