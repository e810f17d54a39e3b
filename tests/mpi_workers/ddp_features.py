"""DDP's other behaviours on N ranks: no_sync, find_unused_parameters, buffers, errors, DistributedSampler."""
from __future__ import annotations

import numpy as np

from common import dist, done, runtime, same_everywhere, start

rank, world = start()
nn, F = runtime.nn, runtime.nn.functional
DDP = nn.parallel.DistributedDataParallel
runtime.set_default_dtype(runtime.float64)


def grads(model):
    return [None if p.grad is None else p.grad.numpy().copy() for p in model.parameters()]


def local_batch(step):
    rng = np.random.default_rng(100 * step + rank)
    return runtime.tensor(rng.standard_normal((3, 4)))


# no_sync: gradients stay local inside, and the next synced backward averages everything accumulated
runtime.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
ddp = DDP(net)
with ddp.no_sync():
    ddp(local_batch(0)).pow(2).mean().backward()
local = grads(net)
assert not same_everywhere(local[0]), "no_sync must not all-reduce"
ddp(local_batch(1)).pow(2).mean().backward()
runtime.manual_seed(0)
alone = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
for step in range(2):
    for r in range(world):
        rng = np.random.default_rng(100 * step + r)
        (alone(runtime.tensor(rng.standard_normal((3, 4)))).pow(2).mean() / world).backward()
for got, want in zip(grads(net), grads(alone)):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)

# find_unused_parameters: a branch used on rank 0 only is averaged (rank 0's gradient / world); one never used
# anywhere keeps .grad None


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk, self.sometimes, self.never = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, use_branch: bool):
        h = self.trunk(x)
        return self.sometimes(h) if use_branch else h


for cap in (None, 0.0001):  # default buckets; 104-byte ones: weights all-reduced in place in .grad, biases copied
    runtime.manual_seed(0)
    branchy = Branchy()
    ddp = DDP(branchy, find_unused_parameters=True, bucket_cap_mb=cap)
    for step in range(3):
        for p in branchy.parameters():
            p.grad = None
        out = ddp(local_batch(step), rank == 0).sum()
        if step == 2:  # zero_grad between forward and backward: unused parameters are marked ready in backward
            for p in branchy.parameters():
                p.grad = runtime.ones_like(p)
        out.backward()
        if step < 2:
            assert branchy.never.weight.grad is None and branchy.never.bias.grad is None
        else:
            assert np.array_equal(branchy.never.weight.grad.numpy(), np.ones((4, 4)))
        for p in (branchy.trunk.weight, branchy.sometimes.weight):
            assert p.grad is not None and same_everywhere(p.grad.numpy())
        runtime.manual_seed(0)
        ref = Branchy()
        ref(runtime.tensor(np.random.default_rng(100 * step).standard_normal((3, 4))), True).sum().backward()
        want = ref.sometimes.weight.grad.numpy() / world + (1 if step == 2 else 0)  # every rank adds its ones
        np.testing.assert_allclose(branchy.sometimes.weight.grad.numpy(), want, rtol=0, atol=1e-12)

# without find_unused_parameters, a parameter that gets no gradient is reported at the next forward, as torch
ddp = DDP(Branchy())
ddp(local_batch(0), False).sum().backward()
try:
    ddp(local_batch(0), False)
except RuntimeError as exc:
    assert "find_unused_parameters=True" in str(exc) and "sometimes.weight" in str(exc), str(exc)
else:
    raise AssertionError("an unused parameter should make the next forward raise")

# two backwards through one forward: a gradient would be reduced twice
ddp = DDP(nn.Linear(4, 2))
out = ddp(local_batch(0)).sum()
out.backward(retain_graph=True)
try:
    out.backward()
except RuntimeError as exc:
    assert "only once" in str(exc)
else:
    raise AssertionError("a second backward through one DDP forward should raise")

# buffers: rank 0's are broadcast at construction and before each forward; state_dict keys carry "module."
runtime.manual_seed(rank)
bn_net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
bn_net[1].running_mean.fill_(float(rank))
ddp = DDP(bn_net)
assert same_everywhere(bn_net[0].weight.detach().numpy()) and float(bn_net[1].running_mean[0]) == 0.0
bn_net[1].running_mean.fill_(float(rank + 5))  # ranks drift apart; the next forward re-broadcasts rank 0's
ddp.eval()  # (training would update the statistics from the local batch after the broadcast)
ddp(local_batch(0)).sum().backward()
assert float(bn_net[1].running_mean[0]) == 5.0 and same_everywhere(bn_net[1].running_mean.numpy())
keys = list(ddp.state_dict())
assert keys and all(k.startswith("module.") for k in keys) and "module.1.running_mean" in keys
assert len(ddp.bucket_sizes()) >= 1

# gradient_as_bucket_view: .grad is a view of its bucket (no copy back) and accumulates there; same values
results = []
for as_view in (False, True):
    for cap in (None, 0.0001):  # flat buckets; weights reduced in their own .grad arrays (biases still flat)
        runtime.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
        ddp = DDP(net, gradient_as_bucket_view=as_view, bucket_cap_mb=cap)
        opt = runtime.optim.SGD(net.parameters(), lr=0.1)
        grad_arrays = None
        for step in range(3):
            opt.zero_grad(set_to_none=False)
            ddp(local_batch(step)).pow(2).mean().backward()
            opt.step()
            if step == 1:
                grad_arrays = [p.grad._data for p in net.parameters()]
        results.append([p.detach().numpy().copy() for p in net.parameters()])
        solo = [b.solo for b in ddp._buckets for _ in b.params]
        assert any(solo) == (cap is not None)
        assert all((p.grad._data.base is not None) == as_view for p in net.parameters() if p.numel() * 8 < 104)
        assert all(p.grad._data is a for p, a in zip(net.parameters(), grad_arrays))  # .grad kept, in place
for a, b in zip(results[0], results[-1]):
    np.testing.assert_array_equal(a, b)
for other in results[1:-1]:
    for a, b in zip(results[0], other):
        np.testing.assert_array_equal(a, b)

# a strided .grad (MPI cannot reduce it in place) goes through a staging array and is written back into itself
got = []
for strided in (False, True):
    runtime.manual_seed(0)
    lin = nn.Linear(4, 4)
    ddp = DDP(lin, bucket_cap_mb=0.0001)
    lin.weight.grad = runtime.zeros(4, 4).t() if strided else runtime.zeros(4, 4)
    kept = lin.weight.grad
    ddp(local_batch(0)).pow(2).sum().backward()
    assert lin.weight.grad is kept and same_everywhere(kept.numpy())
    got.append(kept.numpy().copy())
np.testing.assert_array_equal(got[0], got[1])

# comm hooks: torch's allreduce_hook is the built-in average, fp16_compress_hook close to it, a custom hook (here
# one that keeps gradients local) replaces it; buckets both flat and reduced in .grad
from runtime.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402


def trained(hook=None, state=None, cap=0.0001, group=None):
    runtime.manual_seed(rank)  # ranks start apart: DDP broadcasts the group's first rank's parameters
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    ddp = DDP(net, bucket_cap_mb=cap, process_group=group)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = runtime.optim.SGD(net.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        ddp(local_batch(step)).pow(2).mean().backward()
        opt.step()
    return [p.detach().numpy().copy() for p in net.parameters()], ddp


def keep_local(state, bucket):
    state.append(bucket.index())
    future = runtime.futures.Future()
    future.set_result(bucket.buffer())
    return future


for cap in (None, 0.0001):
    plain, _ = trained(cap=cap)
    for got, want in zip(trained(default_hooks.allreduce_hook, None, cap)[0], plain):
        np.testing.assert_array_equal(got, want)
    whole = dist.new_group(list(range(world)))
    for got, want in zip(trained(default_hooks.allreduce_hook, whole, cap)[0], plain):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(trained(None, None, cap, group=whole)[0], plain):
        np.testing.assert_array_equal(got, want)
    dist.destroy_process_group(whole)
    half, _ = trained(default_hooks.fp16_compress_hook, None, cap)
    for got, want in zip(half, plain):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)
    seen = []
    local, ddp = trained(keep_local, seen, cap)
    assert seen[:len(ddp.bucket_sizes())] == list(range(len(ddp.bucket_sizes())))
    assert not same_everywhere(local[0])
try:
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
except RuntimeError as exc:
    assert "only be called once" in str(exc)
else:
    raise AssertionError("a second comm hook should raise")

# DistributedSampler takes rank and world size from the process group: shards are disjoint and cover the dataset
sampler = runtime.utils.data.DistributedSampler(range(10), shuffle=True, seed=3)
sampler.set_epoch(2)
mine = runtime.tensor(list(sampler) + [-1] * (5 - len(sampler)))
everyone = [runtime.zeros_like(mine) for _ in range(world)]
dist.all_gather(everyone, mine)
flat = [int(i) for t in everyone for i in t.tolist() if i >= 0]
assert sorted(set(flat)) == list(range(10)) and len(flat) == -(-10 // world) * world
done("ddp features")
