"""SyncBatchNorm: batch norm whose training statistics cover the batches of every rank of a process group (runtime's
MPI collectives), and convert_sync_batchnorm, which swaps a model's batch norms for it. On one rank, without a
process group, or in eval mode it is BatchNorm."""
from __future__ import annotations

import math

from ...autograd import grad_mode
from .layers import _BatchNorm
from .module import Module


class SyncBatchNorm(_BatchNorm):
    _expected_dims = tuple(range(2, 9))

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.process_group = process_group

    def forward(self, input):
        if input.ndim < 2:
            raise ValueError(f"expected at least 2D input (got {input.ndim}D input)")
        if not self.training or _world(self.process_group) <= 1:
            return super().forward(input)
        return self._synced(input)

    def _synced(self, input):
        """Normalized with the mean and variance over every rank's batch (two all-reduces, differentiable: the
        gradient flows back through them to every rank's input)."""
        from ...distributed.nn.functional import all_reduce

        dims = (0,) + tuple(range(2, input.ndim))
        shape = (1, -1) + (1,) * (input.ndim - 2)
        count = math.prod(input.shape[d] for d in dims)
        total = all_reduce(input.new_full((1,), float(count)), group=self.process_group).item()
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.shape}")
        mean = all_reduce(input.sum(dims), group=self.process_group) / total
        centered = input - mean.reshape(shape)
        var = all_reduce((centered * centered).sum(dims), group=self.process_group) / total
        out = centered / (var + self.eps).sqrt().reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape)
        if self.bias is not None:
            out = out + self.bias.reshape(shape)
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach() * (total / (total - 1)))
        return out

    def _update_running_stats(self, mean, unbiased_var) -> None:
        with grad_mode.no_grad():
            self.num_batches_tracked.add_(1)
            m = 1.0 / float(self.num_batches_tracked.item()) if self.momentum is None else self.momentum
            self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype) * m)
            self.running_var.mul_(1 - m).add_(unbiased_var.to(self.running_var.dtype) * m)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group=None) -> Module:
        """The module with every BatchNorm*D (at any depth) replaced by a SyncBatchNorm holding the same parameters
        and buffers."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm) and \
                type(module).__name__.startswith("BatchNorm"):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group)
            for name in ("weight", "bias"):
                converted._parameters[name] = module._parameters[name]
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                converted._buffers[name] = module._buffers[name]
            converted.train(module.training)
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted


def _world(group) -> int:
    from ... import distributed

    if not distributed.is_initialized():
        return 1
    return distributed.get_world_size(group)
