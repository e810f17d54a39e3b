"""Lazy convolutions and norms (torch.nn.LazyConv2d, LazyBatchNorm2d, ...): the input's channel count is read on the
first call, which builds the module for it, materializes this module's parameters in place with the built one's
values, and makes this module that module (as torch's lazy modules become their concrete class)."""
from __future__ import annotations

from ...autograd import grad_mode
from ..parameter import UninitializedBuffer, UninitializedParameter, is_lazy
from .extra import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from .layers import (BatchNorm1d, BatchNorm2d, BatchNorm3d, Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d,
                     ConvTranspose3d)
from .module import Module


class _Lazy(Module):
    """A module of class `becomes` whose first argument (the input channels) comes from its first input."""

    becomes: type = Module
    batched_ndim = 0  # the input rank with a batch dim: channels at dim 1 then, else at dim 0

    def __init__(self, *args, **kwargs):
        Module.__init__(self)
        self._lazy_arguments = (args, kwargs)
        channels = kwargs.get("groups", 1)
        probe = self.becomes(channels, *args, **kwargs)  # the parameters the module will have
        for name, p in probe._parameters.items():
            self.register_parameter(name, None if p is None else UninitializedParameter())
        for name, b in probe._buffers.items():  # running stats wait for the channels; a step count does not
            lazy = b is not None and b.ndim > 0
            self.register_buffer(name, UninitializedBuffer() if lazy else b,
                                 persistent=name not in probe._non_persistent_buffers_set)
        described = probe.extra_repr()  # torch shows the channels still unknown as 0
        self._lazy_repr = "0" + described[len(str(channels)):] if described.startswith(str(channels)) else described

    def extra_repr(self) -> str:
        return self._lazy_repr

    def has_uninitialized_params(self) -> bool:
        return any(is_lazy(t) for t in (*self._parameters.values(), *self._buffers.values()))

    def channel_dim(self, input) -> int:
        return 1 if input.ndim == self.batched_ndim else 0

    def forward(self, input):
        self.initialize_parameters(input)
        return self.forward(input)  # the built class's forward, now this module's

    def initialize_parameters(self, input) -> None:
        args, kwargs = self._lazy_arguments
        built = self.becomes(input.shape[self.channel_dim(input)], *args, **kwargs)
        with grad_mode.no_grad():  # (what load_state_dict materialized keeps its loaded values)
            for registry, built_registry in ((self._parameters, built._parameters), (self._buffers, built._buffers)):
                for name, value in built_registry.items():
                    mine = registry.get(name)
                    if is_lazy(mine):
                        mine.materialize(tuple(value.shape), value.dtype)
                        mine.copy_(value)
        own = set(Module().__dict__)  # Module's registries and hooks: this module keeps its own
        self.__dict__.update({k: v for k, v in built.__dict__.items() if k not in own})
        del self._lazy_arguments, self._lazy_repr
        self.__class__ = self.becomes


def _lazy(concrete: type, batched_ndim: int, channels_at_one: bool = False) -> type:
    """The lazy class of a concrete module class."""
    body = {"becomes": concrete, "batched_ndim": batched_ndim,
            "__doc__": f"A {concrete.__name__} whose input channels are read from its first input."}
    if channels_at_one:  # batch norms always see a batch: their channels are at dim 1
        body["channel_dim"] = lambda self, input: 1
    return type(f"Lazy{concrete.__name__}", (_Lazy,), body)


LazyConv1d, LazyConv2d, LazyConv3d = (_lazy(c, n) for c, n in ((Conv1d, 3), (Conv2d, 4), (Conv3d, 5)))
LazyConvTranspose1d, LazyConvTranspose2d, LazyConvTranspose3d = (
    _lazy(c, n) for c, n in ((ConvTranspose1d, 3), (ConvTranspose2d, 4), (ConvTranspose3d, 5)))
LazyBatchNorm1d, LazyBatchNorm2d, LazyBatchNorm3d = (
    _lazy(c, n, channels_at_one=True) for c, n in ((BatchNorm1d, 3), (BatchNorm2d, 4), (BatchNorm3d, 5)))
LazyInstanceNorm1d, LazyInstanceNorm2d, LazyInstanceNorm3d = (
    _lazy(c, n) for c, n in ((InstanceNorm1d, 3), (InstanceNorm2d, 4), (InstanceNorm3d, 5)))
