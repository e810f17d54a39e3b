"""The last of torch.nn's layer classes for issue 15: alpha dropout, CTC and multilabel margin losses, unpooling,
3-D adaptive max and LP pooling (thin Modules over runtime.nn.functional, with torch's defaults and reprs)."""
from __future__ import annotations

from .. import functional as F
from .extra import _Adaptive, _LPPool
from .layers import Dropout, _Loss
from .module import Module

__all__ = ["AlphaDropout", "FeatureAlphaDropout", "CTCLoss", "MultiLabelMarginLoss", "MaxUnpool1d", "MaxUnpool2d",
           "MaxUnpool3d", "AdaptiveMaxPool3d", "LPPool3d"]


class AlphaDropout(Dropout):
    def forward(self, input):
        return F.alpha_dropout(input, self.p, self.training, self.inplace)


class FeatureAlphaDropout(Dropout):
    def forward(self, input):
        return F.feature_alpha_dropout(input, self.p, self.training, self.inplace)


class CTCLoss(_Loss):
    def __init__(self, blank: int = 0, reduction: str = "mean", zero_infinity: bool = False):
        super().__init__(reduction=reduction)
        self.blank, self.zero_infinity = blank, zero_infinity

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank, self.reduction,
                          self.zero_infinity)


class MultiLabelMarginLoss(_Loss):
    def forward(self, input, target):
        return F.multilabel_margin_loss(input, target, reduction=self.reduction)


class _MaxUnpoolNd(Module):
    _nd = 0

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        nd = self._nd
        self.kernel_size = F._ntuple(kernel_size, nd, "kernel_size")
        self.stride = F._ntuple(stride if stride is not None else kernel_size, nd, "stride")
        self.padding = F._ntuple(padding, nd, "padding")

    def forward(self, input, indices, output_size=None):
        fn = (F.max_unpool1d, F.max_unpool2d, F.max_unpool3d)[self._nd - 1]
        return fn(input, indices, self.kernel_size, self.stride, self.padding, output_size)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxUnpool1d(_MaxUnpoolNd):
    _nd = 1


class MaxUnpool2d(_MaxUnpoolNd):
    _nd = 2


class MaxUnpool3d(_MaxUnpoolNd):
    _nd = 3


class AdaptiveMaxPool3d(_Adaptive):
    _fn = staticmethod(F.adaptive_max_pool3d)


class LPPool3d(_LPPool):
    _fn = staticmethod(F.lp_pool3d)
