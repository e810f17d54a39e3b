"""Recurrent layers: RNN, LSTM, GRU and their cells, with torch's parameter names, layout and initialisation.

Each step is a composition of linear, sigmoid/tanh and elementwise ops, so autograd and nnc's tracer see only
primitives (a traced RNN unrolls its time loop). The input projection of a whole layer is one linear over all
time steps; only the hidden projection runs per step. Packed sequences run padded, with a per-step mask that
holds each sequence's state once its length is reached.
"""
from __future__ import annotations

import math

from ... import api
from .. import functional as F
from .. import init
from ..utils.rnn import PackedSequence, _pack_sorted, pad_packed_sequence
from .layers import _empty, _factory
from .module import Module

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _lstm_step(x_proj, h, c, w_hh, b_hh, w_hr):
    gates = x_proj + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, -1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    h = o.sigmoid() * c.tanh()
    if w_hr is not None:
        h = F.linear(h, w_hr)
    return h, c


def _gru_step(x_proj, h, w_hh, b_hh):
    hh = F.linear(h, w_hh, b_hh)
    x_r, x_z, x_n = x_proj.chunk(3, -1)
    h_r, h_z, h_n = hh.chunk(3, -1)
    r = (x_r + h_r).sigmoid()
    z = (x_z + h_z).sigmoid()
    n = (x_n + r * h_n).tanh()
    return n + z * (h - n)  # (1 - z) * n + z * h


def _rnn_step(x_proj, h, w_hh, b_hh, relu):
    pre = x_proj + F.linear(h, w_hh, b_hh)
    return pre.relu() if relu else pre.tanh()


class RNNBase(Module):
    """The shared parameter layout of RNN, LSTM and GRU (torch.nn.RNNBase)."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        if mode not in _GATES:
            raise ValueError(f"Unrecognized RNN mode: {mode}")
        if not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError("hidden_size must be a positive integer" if isinstance(hidden_size, int)
                             else f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError("num_layers must be greater than or equal to 1")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        _factory(device, dtype)
        directions = 2 if bidirectional else 1
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size or hidden_size
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(directions):
                layer_input = input_size if layer == 0 else real_hidden * directions
                suffix = "_reverse" if direction == 1 else ""
                shapes = [("weight_ih", (gate_size, layer_input)), ("weight_hh", (gate_size, real_hidden))]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size:
                    shapes.append(("weight_hr", (proj_size, hidden_size)))
                names = []
                for kind, shape in shapes:
                    name = f"{kind}_l{layer}{suffix}"
                    setattr(self, name, _empty(*shape, device=device, dtype=dtype))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    @property
    def _flat_weights(self):
        return [getattr(self, name) for name in self._flat_weights_names]

    @property
    def all_weights(self):
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """A no-op: parameters are separate tensors here (torch's cuDNN flattening has no meaning on numpy)."""

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # --- forward -------------------------------------------------------------------------------

    def _layer_weights(self, layer: int, direction: int) -> dict:
        names = self._all_weights[layer * (2 if self.bidirectional else 1) + direction]
        return {name.split("_l")[0]: getattr(self, name) for name in names}

    def _state_shapes(self, batch):
        directions = 2 if self.bidirectional else 1
        h_shape = (self.num_layers * directions,) + batch + (self.proj_size or self.hidden_size,)
        c_shape = (self.num_layers * directions,) + batch + (self.hidden_size,)
        return h_shape, c_shape

    def _run(self, input, hx, lengths):
        """(output (L, N, D*H), h_n, c_n or None) for a time-major batched input; lengths masks padded steps."""
        lstm = self.mode == "LSTM"
        directions = 2 if self.bidirectional else 1
        steps = input.shape[0]
        masks = None
        if lengths is not None:
            from ... import factories

            length_t = factories.tensor(lengths).reshape(1, -1, 1)
            masks = factories.arange(steps).reshape(-1, 1, 1) < length_t  # (L, N, 1)
        h0, c0 = hx if lstm else (hx, None)
        h_out, c_out = [], []
        x = input
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                idx = layer * directions + direction
                w = self._layer_weights(layer, direction)
                x_proj = F.linear(x, w["weight_ih"], w.get("bias_ih"))
                h = h0[idx]
                c = c0[idx] if lstm else None
                order = range(steps - 1, -1, -1) if direction == 1 else range(steps)
                seq = [None] * steps
                for t in order:
                    if lstm:
                        h_new, c_new = _lstm_step(x_proj[t], h, c, w["weight_hh"], w.get("bias_hh"),
                                                  w.get("weight_hr"))
                    elif self.mode == "GRU":
                        h_new = _gru_step(x_proj[t], h, w["weight_hh"], w.get("bias_hh"))
                    else:
                        h_new = _rnn_step(x_proj[t], h, w["weight_hh"], w.get("bias_hh"), self.mode == "RNN_RELU")
                    if masks is not None:
                        h_new = api.where(masks[t], h_new, h)
                        if lstm:
                            c_new = api.where(masks[t], c_new, c)
                        seq[t] = api.where(masks[t], h_new, 0.0)
                    else:
                        seq[t] = h_new
                    h = h_new
                    if lstm:
                        c = c_new
                outputs.append(api.stack(seq, 0))
                h_out.append(h)
                c_out.append(c)
            x = outputs[0] if directions == 1 else api.cat(outputs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        h_n = api.stack(h_out, 0)
        return x, h_n, (api.stack(c_out, 0) if lstm else None)

    def forward(self, input, hx=None):
        lstm = self.mode == "LSTM"
        packed = isinstance(input, PackedSequence)
        lengths = None
        if packed:
            sorted_indices, unsorted_indices = input.sorted_indices, input.unsorted_indices
            padded, length_t = pad_packed_sequence(input)
            lengths = [int(v) for v in length_t.tolist()]
            x, batched = padded, True
        else:
            if input.ndim not in (2, 3):
                raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {input.ndim}D instead")
            batched = input.ndim == 3
            x = input if batched else input.unsqueeze(1)
            if batched and self.batch_first:
                x = x.transpose(0, 1)
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {x.shape[-1]}")
        batch = x.shape[1]
        h_shape, c_shape = self._state_shapes((batch,))
        if hx is None:
            h0 = x.new_zeros(h_shape)
            hx = (h0, x.new_zeros(c_shape)) if lstm else h0
        else:
            hx = self._check_hidden(hx, batched, h_shape, c_shape)
        out, h_n, c_n = self._run(x, hx, lengths)
        if packed:
            # the padded run is in the caller's batch order; repack in the input's order
            out = _pack_sorted(out, input.batch_sizes, sorted_indices, unsorted_indices)
        elif not batched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        elif self.batch_first:
            out = out.transpose(0, 1)
        return (out, (h_n, c_n)) if lstm else (out, h_n)

    def _check_hidden(self, hx, batched, h_shape, c_shape):
        lstm = self.mode == "LSTM"
        if lstm and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            raise RuntimeError("LSTM: hx must be a tuple (h_0, c_0)")
        states = list(hx) if lstm else [hx]
        expected = [h_shape, c_shape] if lstm else [h_shape]
        for i, (state, shape) in enumerate(zip(states, expected)):
            if not batched:
                if state.ndim != 2:
                    raise RuntimeError(f"For unbatched 2-D input, hx should also be 2-D but got {state.ndim}-D "
                                       f"tensor")
                state = state.unsqueeze(1)
            elif state.ndim != 3:
                raise RuntimeError(f"For batched 3-D input, hx should also be 3-D but got {state.ndim}-D tensor")
            if tuple(state.shape) != shape:
                which = "hidden" if i == 0 else "cell"
                raise RuntimeError(f"Expected {which} size {shape}, got {list(state.shape)}")
            states[i] = state
        return tuple(states) if lstm else states[0]


class RNN(RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu)."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            self.nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            self.nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if self.nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif self.nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{self.nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(mode, *args, **kwargs)


class LSTM(RNNBase):
    """Long short-term memory, gates (i, f, g, o) in torch's order, optional projection of h (proj_size)."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """Gated recurrent unit, gates (r, z, n) in torch's order."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)


# --- cells --------------------------------------------------------------------------------------------

class RNNCellBase(Module):
    def __init__(self, input_size, hidden_size, bias, num_chunks, device=None, dtype=None):
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        self.weight_ih = _empty(num_chunks * hidden_size, input_size, device=device, dtype=dtype)
        self.weight_hh = _empty(num_chunks * hidden_size, hidden_size, device=device, dtype=dtype)
        if bias:
            self.bias_ih = _empty(num_chunks * hidden_size, device=device, dtype=dtype)
            self.bias_hh = _empty(num_chunks * hidden_size, device=device, dtype=dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _prepare(self, input, hx, count):
        if input.ndim not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.shape[-1]} expected {self.input_size}")
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        if hx is None:
            zeros = x.new_zeros((x.shape[0], self.hidden_size))
            states = [zeros] * count
        else:
            states = list(hx) if count == 2 else [hx]
            for s in states:
                if s.ndim != (2 if batched else 1):
                    raise RuntimeError(f"{type(self).__name__}: Expected hidden to be "
                                       f"{2 if batched else 1}D, got {s.ndim}D instead")
            states = [s if batched else s.unsqueeze(0) for s in states]
        return x, states, batched


class RNNCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        x, (h,), batched = self._prepare(input, hx, 1)
        h = _rnn_step(F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh,
                      self.nonlinearity == "relu")
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        x, (h, c), batched = self._prepare(input, hx, 2)
        h, c = _lstm_step(F.linear(x, self.weight_ih, self.bias_ih), h, c, self.weight_hh, self.bias_hh, None)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        x, (h,), batched = self._prepare(input, hx, 1)
        h = _gru_step(F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh)
        return h if batched else h.squeeze(0)
