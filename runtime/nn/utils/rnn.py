"""runtime.nn.utils.rnn: PackedSequence and the pack/pad helpers, as torch.nn.utils.rnn.

A PackedSequence holds the time steps of a batch of sequences sorted by decreasing length, step after step:
`data` (sum of lengths, *), `batch_sizes` (how many sequences are still running at each step),
and the permutations between the caller's batch order and the sorted one.
"""
from __future__ import annotations

from collections import namedtuple

import numpy as np

from ... import api
from ... import dtypes as dt
from ... import factories
from ...tensor import Tensor

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence", "unpad_sequence",
           "pack_sequence", "unpack_sequence", "invert_permutation"]


class PackedSequence(namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])):
    """The packed form of a batch of variable-length sequences (see the module docstring)."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = invert_permutation(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs) -> "PackedSequence":
        data = self.data.to(*args, **kwargs)
        return self if data is self.data else type(self)(data, self.batch_sizes, self.sorted_indices,
                                                         self.unsorted_indices)

    def cpu(self) -> "PackedSequence":
        return self

    def double(self) -> "PackedSequence":
        return self.to(dtype=dt.float64)

    def float(self) -> "PackedSequence":
        return self.to(dtype=dt.float32)

    @property
    def is_cuda(self) -> bool:
        return False

    def is_pinned(self) -> bool:
        return False


def invert_permutation(permutation):
    if permutation is None:
        return None
    inverse = np.empty(permutation.numel(), dtype=np.int64)
    inverse[np.asarray(permutation.tolist(), dtype=np.int64)] = np.arange(permutation.numel())
    return factories.tensor(inverse.tolist(), dtype=dt.int64)


def _lengths_list(lengths) -> list:
    if isinstance(lengths, Tensor):
        if lengths.ndim != 1:
            raise RuntimeError(f"'lengths' argument should be a 1D tensor, got {lengths.ndim}D")
        return [int(v) for v in lengths.tolist()]
    return [int(v) for v in lengths]


def _batch_sizes(sorted_lengths: list) -> list:
    return [sum(1 for n in sorted_lengths if n > t) for t in range(sorted_lengths[0])] if sorted_lengths else []


def _pack_sorted(padded, batch_sizes, sorted_indices, unsorted_indices) -> PackedSequence:
    """Pack a time-major padded batch (caller's order) whose sorted lengths give batch_sizes."""
    x = padded if sorted_indices is None else padded.index_select(1, sorted_indices)
    sizes = [int(v) for v in batch_sizes.tolist()]
    steps = [x[t, :bs] for t, bs in enumerate(sizes)]
    data = steps[0] if len(steps) == 1 else api.cat(steps, 0)
    return PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True) -> PackedSequence:
    """Pack a padded batch (T, B, *) (or (B, T, *) with batch_first) of sequences of the given lengths."""
    lengths = _lengths_list(lengths)
    batch_dim = 0 if batch_first else 1
    if len(lengths) != input.shape[batch_dim]:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {len(lengths)} "
                           f"(batch_size={input.shape[batch_dim]})")
    if any(n <= 0 for n in lengths):
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' "
                           "that is <= 0")
    if enforce_sorted:
        if any(a < b for a, b in zip(lengths, lengths[1:])):
            raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
                               "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence "
                               "to sidestep this requirement if you do not need ONNX exportability.")
        sorted_indices = None
        sorted_lengths = lengths
    else:
        order = np.argsort(-np.asarray(lengths), kind="stable")
        sorted_indices = factories.tensor(order.tolist(), dtype=dt.int64)
        sorted_lengths = [lengths[i] for i in order]
    if sorted_lengths[0] > input.shape[1 - batch_dim]:
        raise RuntimeError(f"Expected all lengths to be at most the padded length {input.shape[1 - batch_dim]}, "
                           f"got {sorted_lengths[0]}")
    x = input.transpose(0, 1) if batch_first else input
    batch_sizes = factories.tensor(_batch_sizes(sorted_lengths), dtype=dt.int64)
    return _pack_sorted(x, batch_sizes, sorted_indices, invert_permutation(sorted_indices))


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """(padded (T, B, *) or (B, T, *), lengths int64 in the caller's order): the inverse of pack_padded_sequence."""
    sizes = [int(v) for v in sequence.batch_sizes.tolist()]
    steps = len(sizes)
    if total_length is not None:
        if total_length < steps:
            raise ValueError(f"Expected total_length to be at least the length of the longest sequence in input, "
                             f"but got total_length={total_length} and max sequence length being {steps}")
    else:
        total_length = steps
    batch = sizes[0]
    data = sequence.data
    rows, offset = [], 0
    tail = tuple(data.shape[1:])
    for bs in sizes:
        chunk = data[offset:offset + bs]
        offset += bs
        if bs < batch:
            chunk = api.cat([chunk, chunk.new_full((batch - bs,) + tail, padding_value)], 0)
        rows.append(chunk)
    if total_length > steps:
        rows += [data.new_full((batch,) + tail, padding_value)] * (total_length - steps)
    padded = api.stack(rows, 0)
    lengths = [sum(1 for bs in sizes if bs > b) for b in range(batch)]
    if sequence.unsorted_indices is not None:
        padded = padded.index_select(1, sequence.unsorted_indices)
        lengths = [lengths[i] for i in sequence.unsorted_indices.tolist()]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, factories.tensor(lengths, dtype=dt.int64)


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """Stack tensors (L_i, *) into (L_max, B, *) (or (B, L_max, *)), padding each with padding_value."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    if isinstance(sequences, Tensor):
        sequences = sequences.unbind(0)
    sequences = list(sequences)
    longest = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        missing = longest - s.shape[0]
        if missing:
            fill = s.new_full((missing,) + tuple(s.shape[1:]), padding_value)
            s = api.cat([s, fill] if padding_side == "right" else [fill, s], 0)
        padded.append(s)
    return api.stack(padded, 0 if batch_first else 1)


def unpad_sequence(padded_sequences, lengths, batch_first=False) -> list:
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [x[i, :n] for i, n in enumerate(_lengths_list(lengths))]


def pack_sequence(sequences, enforce_sorted=True) -> PackedSequence:
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences) -> list:
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
