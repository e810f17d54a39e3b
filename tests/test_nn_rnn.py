"""nn.RNN/LSTM/GRU, their cells and nn.utils.rnn against torch: outputs, states, gradients, parameter layout,
initialisation, packed sequences, and the compiled forward+backward against eager."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
import runtime.nn as nn
from nn_oracle import copy_weights, run_both
from runtime.nn.utils import rnn as rnn_utils

RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.standard_normal(shape)


RNN_CASES = [
    ("RNN", dict()),
    ("RNN", dict(nonlinearity="relu", num_layers=2)),
    ("RNN", dict(bias=False, bidirectional=True)),
    ("LSTM", dict()),
    ("LSTM", dict(num_layers=2, bidirectional=True)),
    ("LSTM", dict(proj_size=3)),
    ("LSTM", dict(proj_size=2, num_layers=2, bidirectional=True, bias=False)),
    ("GRU", dict()),
    ("GRU", dict(num_layers=3, bidirectional=True)),
    ("GRU", dict(bias=False, batch_first=True)),
    ("LSTM", dict(batch_first=True, num_layers=2)),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'defaults'}" for n, kw in RNN_CASES]


@pytest.mark.parametrize("name,kw", RNN_CASES, ids=IDS)
def test_rnn_matches_torch_with_default_state(torch, name, kw):
    x = _x(3, 5, 4) if kw.get("batch_first") else _x(5, 3, 4)
    run_both(torch, lambda lib: getattr(lib.nn, name)(4, 6, **kw), [x])


@pytest.mark.parametrize("name,kw", RNN_CASES, ids=IDS)
def test_rnn_matches_torch_with_given_state(torch, name, kw):
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    out = kw.get("proj_size") or 6
    x = _x(3, 5, 4) if kw.get("batch_first") else _x(5, 3, 4)
    h = _x(layers, 3, out)
    state = (h, _x(layers, 3, 6)) if name == "LSTM" else h
    run_both(torch, lambda lib: getattr(lib.nn, name)(4, 6, **kw), [x, state])


@pytest.mark.parametrize("name", ["RNN", "LSTM", "GRU"])
def test_rnn_unbatched_input(torch, name):
    h = _x(2, 6)
    state = (h, _x(2, 6)) if name == "LSTM" else h
    run_both(torch, lambda lib: getattr(lib.nn, name)(4, 6, num_layers=2), [_x(5, 4), state])


@pytest.mark.parametrize("name,kw", RNN_CASES, ids=IDS)
def test_rnn_state_dict_keys_shapes_and_repr_match_torch(torch, name, kw):
    ours, theirs = getattr(nn, name)(4, 6, **kw), getattr(torch.nn, name)(4, 6, **kw)
    assert repr(ours) == repr(theirs)
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    assert all(tuple(a[k].shape) == tuple(b[k].shape) for k in a)
    copy_weights(theirs, ours)  # torch's state_dict loads


def test_rnn_initialisation_is_uniform_in_one_over_sqrt_hidden():
    m = nn.LSTM(5, 16, num_layers=2)
    bound = 1 / 4
    for p in m.parameters():
        v = p.detach().numpy()
        assert np.abs(v).max() <= bound and np.abs(v).max() > 0.8 * bound


def test_rnn_dropout_between_layers_only_in_training():
    m = nn.GRU(4, 5, num_layers=2, dropout=0.5)
    x = runtime.tensor(_x(6, 2, 4), dtype=runtime.float32)
    m.eval()
    a, b = m(x)[0], m(x)[0]
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    m.train()
    runtime.manual_seed(1)
    c = m(x)[0]
    assert not np.allclose(a.detach().numpy(), c.detach().numpy())


def test_rnn_errors():
    with pytest.raises(ValueError, match="proj_size"):
        nn.GRU(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="proj_size has to be smaller"):
        nn.LSTM(3, 4, proj_size=4)
    with pytest.raises(RuntimeError, match="input_size"):
        nn.LSTM(3, 4)(runtime.zeros(2, 1, 5))
    with pytest.raises(RuntimeError, match="Expected hidden size"):
        nn.GRU(3, 4)(runtime.zeros(2, 1, 3), runtime.zeros(2, 1, 4))


@pytest.mark.parametrize("name,kw", [("RNNCell", dict()), ("RNNCell", dict(nonlinearity="relu", bias=False)),
                                     ("LSTMCell", dict()), ("GRUCell", dict()), ("GRUCell", dict(bias=False))])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_cells_match_torch(torch, name, kw, batched, with_state):
    lead = (3,) if batched else ()
    args = [_x(*lead, 4)]
    if with_state:
        h = _x(*lead, 5)
        args.append((h, _x(*lead, 5)) if name == "LSTMCell" else h)
    ours, theirs = run_both(torch, lambda lib: getattr(lib.nn, name)(4, 5, **kw), args)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())


# --- packed sequences -------------------------------------------------------------------------------

@pytest.mark.parametrize("enforce_sorted,lengths", [(True, [5, 3, 2]), (False, [2, 5, 3])])
@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_and_pad_match_torch(torch, enforce_sorted, lengths, batch_first):
    x = _x(3, 5, 2) if batch_first else _x(5, 3, 2)
    ours = rnn_utils.pack_padded_sequence(runtime.tensor(x), lengths, batch_first, enforce_sorted)
    theirs = torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths), batch_first,
                                                     enforce_sorted)
    np.testing.assert_array_equal(ours.data.numpy(), theirs.data.numpy())
    assert ours.batch_sizes.tolist() == theirs.batch_sizes.tolist()
    for a, b in ((ours.sorted_indices, theirs.sorted_indices), (ours.unsorted_indices, theirs.unsorted_indices)):
        assert (a is None) == (b is None) and (a is None or a.tolist() == b.tolist())
    padded, lens = rnn_utils.pad_packed_sequence(ours, batch_first, padding_value=-1.0, total_length=6)
    t_padded, t_lens = torch.nn.utils.rnn.pad_packed_sequence(theirs, batch_first, padding_value=-1.0,
                                                              total_length=6)
    np.testing.assert_array_equal(padded.numpy(), t_padded.numpy())
    assert lens.tolist() == t_lens.tolist()


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_sequence_and_pack_sequence_match_torch(torch, batch_first, side):
    seqs = [_x(n, 3) for n in (4, 1, 3)]
    ours = rnn_utils.pad_sequence([runtime.tensor(s) for s in seqs], batch_first, 0.5, side)
    theirs = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in seqs], batch_first, 0.5, side)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    packed = rnn_utils.pack_sequence([runtime.tensor(s) for s in seqs], enforce_sorted=False)
    t_packed = torch.nn.utils.rnn.pack_sequence([torch.tensor(s) for s in seqs], enforce_sorted=False)
    np.testing.assert_array_equal(packed.data.numpy(), t_packed.data.numpy())
    for a, b in zip(rnn_utils.unpack_sequence(packed), seqs):
        np.testing.assert_array_equal(a.numpy(), b)


@pytest.mark.parametrize("name,kw", [("LSTM", dict(num_layers=2, bidirectional=True)), ("GRU", dict()),
                                     ("RNN", dict(bidirectional=True)), ("LSTM", dict(proj_size=2))])
def test_rnn_on_packed_sequence_matches_torch(torch, name, kw):
    x = _x(5, 3, 4)
    lengths = [2, 5, 3]
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    h = _x(layers, 3, kw.get("proj_size") or 6)
    state = (h, _x(layers, 3, 6)) if name == "LSTM" else h

    def call(module, x, state):
        lib = runtime if isinstance(x, runtime.Tensor) else torch
        utils = rnn_utils if lib is runtime else torch.nn.utils.rnn
        lens = lengths if lib is runtime else torch.tensor(lengths)
        packed = utils.pack_padded_sequence(x, lens, enforce_sorted=False)
        out, hn = module(packed, state)
        padded, _ = utils.pad_packed_sequence(out)
        return padded, hn, out.data

    run_both(torch, lambda lib: getattr(lib.nn, name)(4, 6, **kw), [x, state], call=call)


# --- compiled ----------------------------------------------------------------------------------------

class _LSTMModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 5, num_layers=2)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out)


@pytest.mark.parametrize("make", [_LSTMModel, lambda: nn.GRU(4, 5, bidirectional=True)])
def test_rnn_compiles_forward_and_backward_like_eager(make):
    import nnc

    runtime.manual_seed(0)
    model = make().double()
    x = runtime.tensor(_x(6, 2, 4))
    eager_out = model(x)
    eager_out = eager_out[0] if isinstance(eager_out, tuple) else eager_out
    eager_out.sum().backward()
    eager_grads = {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
    model.zero_grad()
    compiled = nnc.compile(model)
    out = compiled(x)
    out = out[0] if isinstance(out, tuple) else out
    np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-10, atol=1e-12)
    out.sum().backward()
    for k, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), eager_grads[k], rtol=1e-9, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("name", ["RNN", "LSTM", "GRU"])
def test_rnn_backward_has_no_scatter_per_step(name):
    """Each layer reads its input projection a step at a time (x_proj[t]): the backward concatenates the step
    gradients rather than writing each into a zero tensor of the whole sequence (an index_put per step)."""
    from nnc import pipeline

    model = getattr(nn, name)(4, 5, num_layers=2, bidirectional=True)
    c = pipeline.Compilation(model, {"hx": None}, {"input": runtime.randn(6, 2, 4)}, needs_grad=True)
    pipeline.run_stages(c, until="simplify_backward")
    ops = [n.target.op.name for _, gm in pipeline.stage_graphs(c, "simplify_backward") for n in gm.graph.nodes
           if hasattr(n.target, "op")]
    assert "cat" in ops and "index_put" not in ops
