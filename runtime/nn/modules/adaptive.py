"""AdaptiveLogSoftmaxWithLoss (Grave et al., "Efficient softmax approximation for GPUs"), as torch.nn's: frequent
classes in a head softmax beside one entry per tail cluster, each cluster's rarer classes behind a smaller
projection."""
from __future__ import annotations

from typing import NamedTuple

from ... import api
from .. import functional as F
from .container import ModuleList, Sequential
from .layers import Linear
from .module import Module

__all__ = ["AdaptiveLogSoftmaxWithLoss"]


class _ASMoutput(NamedTuple):
    """Each example's log-probability of its target, and the mean negative log-likelihood."""

    output: object
    loss: object


class AdaptiveLogSoftmaxWithLoss(Module):
    def __init__(self, in_features: int, n_classes: int, cutoffs, div_value: float = 4.0, head_bias: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__()
        cutoffs = list(cutoffs)
        if len(cutoffs) == 0:
            raise ValueError("cutoffs should be a sequence of length larger than 0")
        if cutoffs != sorted(cutoffs) or min(cutoffs) <= 0 or max(cutoffs) > n_classes - 1 or \
                len(set(cutoffs)) != len(cutoffs) or any(int(c) != c for c in cutoffs):
            raise ValueError("cutoffs should be a sequence of unique, positive integers sorted in an increasing "
                             "order, where each value is between 1 and n_classes-1")
        self.in_features, self.n_classes, self.div_value, self.head_bias = in_features, n_classes, div_value, head_bias
        self.cutoffs = cutoffs + [n_classes]
        self.shortlist_size = self.cutoffs[0]
        self.n_clusters = len(self.cutoffs) - 1
        self.head_size = self.shortlist_size + self.n_clusters
        factory = {"device": device, "dtype": dtype}
        self.head = Linear(in_features, self.head_size, bias=head_bias, **factory)
        self.tail = ModuleList()
        for i in range(self.n_clusters):
            hidden = int(in_features // (div_value ** (i + 1)))
            self.tail.append(Sequential(Linear(in_features, hidden, bias=False, **factory),
                                        Linear(hidden, self.cutoffs[i + 1] - self.cutoffs[i], bias=False, **factory)))

    def reset_parameters(self) -> None:
        self.head.reset_parameters()
        for projection in self.tail:
            for linear in projection:
                linear.reset_parameters()

    def forward(self, input, target) -> _ASMoutput:
        batched = _check_shapes(input, target)
        x, t = (input, target) if batched else (input.unsqueeze(0), target.unsqueeze(0))
        if t.numel() and (bool((t < 0).any()) or bool((t >= self.n_classes).any())):
            raise RuntimeError(f"Target values should be in [0, {self.n_classes - 1}], but values in range "
                               f"[{t.min().item()}, {t.max().item()}] were found. ")
        output = x.new_zeros(t.shape[0])
        head_index = t
        for i, (low, high) in enumerate(zip(self.cutoffs, self.cutoffs[1:])):
            rows = ((t >= low) & (t < high)).nonzero().flatten()
            if rows.numel() == 0:
                continue
            head_index = head_index.index_fill(0, rows, self.shortlist_size + i)  # the cluster's head entry
            in_cluster = F.log_softmax(self.tail[i](x.index_select(0, rows)), dim=1)
            output = output.index_copy(0, rows, in_cluster.gather(1, (t[rows] - low).unsqueeze(1)).squeeze(1))
        head = F.log_softmax(self.head(x), dim=1)
        output = output + head.gather(1, head_index.unsqueeze(1)).squeeze(1)
        loss = (-output).mean()
        return _ASMoutput(output if batched else output.squeeze(0), loss)

    def log_prob(self, input):
        """Log-probabilities of all n_classes classes: (N, in_features) -> (N, n_classes)."""
        head = F.log_softmax(self.head(input), dim=1)
        parts = [head[:, :self.shortlist_size]]
        for i, projection in enumerate(self.tail):
            parts.append(F.log_softmax(projection(input), dim=1) + head[:, self.shortlist_size + i].unsqueeze(1))
        return api.cat(parts, 1)

    def predict(self, input):
        """The most probable class of each example (log_prob(input).argmax(1))."""
        return self.log_prob(input).argmax(1)


def _check_shapes(input, target) -> bool:
    """Whether the call is batched (a 1-D target for a 2-D input), after torch's checks of the two."""
    if target.ndim == 1:
        if input.shape[0] != target.shape[0]:
            raise RuntimeError("Input and target should have the same size in the batch dimension.")
        if input.ndim != 2:
            raise RuntimeError(f"1D target tensor expects 2D input tensors, but found inputs with size "
                               f"{tuple(input.shape)}")
        return True
    if target.ndim == 0:
        if input.ndim != 1:
            raise RuntimeError(f"0D target tensor expects 1D input tensors, but found inputs with size "
                               f"{tuple(input.shape)}")
        return False
    raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
