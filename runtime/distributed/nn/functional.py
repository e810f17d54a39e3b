"""torch.distributed.nn.functional: all_reduce as an op autograd differentiates. Each rank's result is the sum of
every rank's input, so the gradient of a rank's input is the sum of every rank's output gradient: backward is
all_reduce(SUM) of the gradients. (Other reductions have no gradient here, as in torch.)"""
from __future__ import annotations

from ...autograd.function import Function
from .. import ReduceOp, all_reduce as _all_reduce_in_place


class _AllReduceSum(Function):
    @staticmethod
    def forward(ctx, group, tensor):
        ctx.group = group
        out = tensor.clone()
        _all_reduce_in_place(out, ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        summed = grad.clone()
        _all_reduce_in_place(summed, ReduceOp.SUM, group=ctx.group)
        return None, summed


def all_reduce(tensor, op=ReduceOp.SUM, group=None):
    """A new tensor holding the reduction of `tensor` over the ranks of `group`, differentiable for SUM."""
    if op is not ReduceOp.SUM:
        out = tensor.clone()
        _all_reduce_in_place(out, op, group=group)
        return out.detach() if out.requires_grad else out
    return _AllReduceSum.apply(group, tensor)
