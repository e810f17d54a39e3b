"""MultiheadAttention (kdim/vdim, add_bias_kv, add_zero_attn, masks) and the Transformer family against torch:
outputs, gradients, state_dict keys and reprs; a word-language-model style subclass of nn.Transformer; compiled
encoder layer against eager."""
from __future__ import annotations

import math

import numpy as np
import pytest

import runtime
import runtime.nn as nn
from nn_oracle import run_both

RNG = np.random.default_rng(0)
L, S, N, E = 5, 4, 3, 8


def _x(*shape):
    return RNG.standard_normal(shape)


def _mask(kind, rows, cols):
    if kind == "bool":
        m = RNG.random((rows, cols)) < 0.3
        m[:, 0] = False  # every query keeps at least one key
        return m
    if kind == "float":
        return RNG.standard_normal((rows, cols))
    return None


MHA_CASES = [
    dict(),
    dict(kdim=5, vdim=6),
    dict(add_bias_kv=True),
    dict(add_zero_attn=True),
    dict(add_bias_kv=True, add_zero_attn=True, kdim=3, vdim=7),
    dict(bias=False, batch_first=True),
]


@pytest.mark.parametrize("kw", MHA_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "defaults")
@pytest.mark.parametrize("masks", ["none", "bool", "float", "padding", "both"])
@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention_matches_torch(torch, kw, masks, average):
    kdim, vdim = kw.get("kdim", E), kw.get("vdim", E)
    bf = kw.get("batch_first", False)
    q = _x(N, L, E) if bf else _x(L, N, E)
    k = _x(N, S, kdim) if bf else _x(S, N, kdim)
    v = _x(N, S, vdim) if bf else _x(S, N, vdim)
    attn = _mask("bool" if masks in ("bool", "both") else masks, L, S) if masks not in ("none", "padding") else None
    pad = None
    if masks in ("padding", "both"):
        pad = np.zeros((N, S), bool)
        pad[0, -2:] = True

    def call(m, q, k, v):
        lib = runtime if isinstance(q, runtime.Tensor) else torch
        am = None if attn is None else lib.tensor(attn)
        kp = None if pad is None else lib.tensor(pad)
        return m(q, k, v, key_padding_mask=kp, attn_mask=am, average_attn_weights=average)

    ours, theirs = run_both(torch, lambda lib: lib.nn.MultiheadAttention(E, 2, **kw), [q, k, v], call=call)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_query_with_every_key_masked_attends_as_torchs_does(torch, need_weights):
    # torch: 0 for such rows without weights (a fully padded sequence in an encoder layer), nan with them; a nan
    # here once reached every in_proj_weight gradient of a left-padded causal batch
    pad = np.zeros((N, S), bool)
    pad[1] = True
    attn = np.zeros((L, S), bool)
    attn[2] = True

    def call(m, q):
        lib = runtime if isinstance(q, runtime.Tensor) else torch
        out, _ = m(q, q[:S], q[:S], key_padding_mask=lib.tensor(pad), attn_mask=lib.tensor(attn),
                   need_weights=need_weights)
        return out

    if need_weights:
        ours, _ = run_both(torch, lambda lib: lib.nn.MultiheadAttention(E, 2), [_x(L, N, E)], call=call, grad=False,
                           tol=dict(rtol=1e-7, atol=1e-9, equal_nan=True))
    else:
        run_both(torch, lambda lib: lib.nn.MultiheadAttention(E, 2), [_x(L, N, E)], call=call)


def test_an_encoder_layer_over_a_fully_padded_sequence_trains_as_torchs(torch):
    def call(m, x):
        lib = runtime if isinstance(x, runtime.Tensor) else torch
        pad = np.zeros((N, L), bool)
        pad[0] = True
        pad[1, :2] = True
        return m(x, src_mask=lib.tensor(np.triu(np.ones((L, L), bool), 1)),
                 src_key_padding_mask=lib.tensor(pad))

    ours, _ = run_both(torch, lambda lib: lib.nn.TransformerEncoderLayer(E, 2, 16, dropout=0.0, batch_first=True),
                       [_x(N, L, E)], call=call, train=True)
    assert all(np.isfinite(p.grad.numpy()).all() for p in ours.parameters())


def test_multihead_attention_unbatched_and_3d_mask(torch):
    def call(m, q, k, v):
        lib = runtime if isinstance(q, runtime.Tensor) else torch
        return m(q, k, v, attn_mask=lib.tensor(mask3))

    mask3 = _x(2 * N, L, S)
    run_both(torch, lambda lib: lib.nn.MultiheadAttention(E, 2), [_x(L, N, E), _x(S, N, E), _x(S, N, E)], call=call)
    run_both(torch, lambda lib: lib.nn.MultiheadAttention(E, 2, kdim=3, vdim=3), [_x(L, E), _x(S, 3), _x(S, 3)])


LAYER_CASES = [dict(), dict(norm_first=True), dict(activation="gelu", batch_first=True), dict(bias=False)]
LAYER_IDS = ["defaults", "norm_first", "gelu-batch_first", "no-bias"]


@pytest.mark.parametrize("kw", LAYER_CASES, ids=LAYER_IDS)
@pytest.mark.parametrize("masked", [False, True])
def test_encoder_matches_torch(torch, kw, masked):
    bf = kw.get("batch_first", False)
    src = _x(N, L, E) if bf else _x(L, N, E)
    causal = np.triu(np.full((L, L), -np.inf), 1)
    pad = np.zeros((N, L), bool)
    pad[1, -1] = True

    def make(lib):
        layer = lib.nn.TransformerEncoderLayer(E, 2, 16, dropout=0.0, **kw)
        return lib.nn.TransformerEncoder(layer, 2, norm=lib.nn.LayerNorm(E), enable_nested_tensor=False)

    def call(m, src):
        lib = runtime if isinstance(src, runtime.Tensor) else torch
        if not masked:
            return m(src)
        return m(src, mask=lib.tensor(causal), src_key_padding_mask=lib.tensor(pad))

    ours, theirs = run_both(torch, make, [src], call=call)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())


@pytest.mark.parametrize("kw", LAYER_CASES, ids=LAYER_IDS)
def test_decoder_matches_torch(torch, kw):
    bf = kw.get("batch_first", False)
    tgt = _x(N, L, E) if bf else _x(L, N, E)
    mem = _x(N, S, E) if bf else _x(S, N, E)
    mem_pad = np.zeros((N, S), bool)
    mem_pad[2, 0] = True

    def make(lib):
        return lib.nn.TransformerDecoder(lib.nn.TransformerDecoderLayer(E, 2, 16, dropout=0.0, **kw), 2)

    def call(m, tgt, mem):
        lib = runtime if isinstance(tgt, runtime.Tensor) else torch
        mask = lib.nn.Transformer.generate_square_subsequent_mask(L, dtype=lib.float64)
        return m(tgt, mem, tgt_mask=mask, memory_key_padding_mask=lib.tensor(mem_pad), tgt_is_causal=True)

    ours, theirs = run_both(torch, make, [tgt, mem], call=call)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("kw", [dict(), dict(norm_first=True, batch_first=True, activation="gelu")])
def test_transformer_matches_torch(torch, kw):
    bf = kw.get("batch_first", False)
    src = _x(N, S, E) if bf else _x(S, N, E)
    tgt = _x(N, L, E) if bf else _x(L, N, E)

    def make(lib):
        return lib.nn.Transformer(E, 2, 2, 1, 16, dropout=0.0, **kw)

    def call(m, src, tgt):
        return m(src, tgt, tgt_mask=m.generate_square_subsequent_mask(L, dtype=src.dtype))

    ours, theirs = run_both(torch, make, [src, tgt], call=call)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_generate_square_subsequent_mask_matches_torch(torch):
    ours = nn.Transformer.generate_square_subsequent_mask(4)
    theirs = torch.nn.Transformer.generate_square_subsequent_mask(4)
    assert ours.dtype is runtime.float32
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_transformer_initialisation_is_xavier_uniform():
    m = nn.Transformer(16, 2, 1, 1, 32)
    w = m.encoder.layers[0].linear1.weight.detach().numpy()
    bound = math.sqrt(6 / (16 + 32))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound


class _PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=64):
        super().__init__()
        import runtime as torch

        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return x + self.pe[:x.size(0), :]


class _TransformerModel(nn.Transformer):
    """The shape of pytorch/examples' word_language_model TransformerModel (written here, not copied)."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers)
        self.src_mask = None
        self.pos_encoder = _PositionalEncoding(ninp)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)

    def forward(self, src):
        import runtime as torch

        if self.src_mask is None or self.src_mask.size(0) != len(src):
            self.src_mask = torch.log(torch.tril(torch.ones(len(src), len(src))))
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
        output = self.encoder(src, mask=self.src_mask)
        return nn.functional.log_softmax(self.decoder(output), dim=-1)


def test_word_language_model_style_subclass_trains():
    runtime.manual_seed(0)
    model = _TransformerModel(20, 16, 2, 32, 2)
    opt = runtime.optim.SGD(model.parameters(), lr=0.1)
    data = runtime.randint(0, 20, (7, 3))
    target = runtime.randint(0, 20, (7 * 3,))
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = nn.functional.nll_loss(model(data).view(-1, 20), target)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_encoder_layer_compiles_like_eager():
    import nnc

    runtime.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, 2, 16, dropout=0.0).double()
    x = runtime.tensor(_x(L, N, E))
    mask = nn.Transformer.generate_square_subsequent_mask(L, dtype=runtime.float64)
    eager = layer(x, src_mask=mask)
    eager.sum().backward()
    grads = {k: p.grad.numpy().copy() for k, p in layer.named_parameters()}
    layer.zero_grad()
    out = nnc.compile(layer)(x, src_mask=mask)
    np.testing.assert_allclose(out.detach().numpy(), eager.detach().numpy(), rtol=1e-10, atol=1e-12)
    out.sum().backward()
    for k, p in layer.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), grads[k], rtol=1e-9, atol=1e-12, err_msg=k)


def _padded_encoder(lib, enable_nested_tensor=True, mask_check=True, **kw):
    import warnings

    layer = lib.nn.TransformerEncoderLayer(E, 2, 16, dropout=0.0, batch_first=kw.pop("batch_first", True), **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        encoder = lib.nn.TransformerEncoder(layer, 2, norm=lib.nn.LayerNorm(E),
                                            enable_nested_tensor=enable_nested_tensor, mask_check=mask_check)
    return encoder, [str(w.message) for w in caught if "nested" in str(w.message)]


ALIGNED = np.array([[False] * 5, [False, False, False, True, True], [False] * 4 + [True]])
SCATTERED = np.array([[False, True, False, False, True]] * 3)


@pytest.mark.parametrize("kw", [dict(), dict(batch_first=False), dict(norm_first=True), dict(activation="gelu"),
                                dict(mask_check=False), dict(enable_nested_tensor=False)],
                         ids=["fast-path", "seq-first", "norm_first", "gelu", "no-mask-check", "nested-off"])
@pytest.mark.parametrize("pad", [ALIGNED, SCATTERED], ids=["left-aligned", "scattered"])
@pytest.mark.parametrize("mode", ["no_grad", "grad", "train"])
def test_encoder_padding_matches_torchs_nested_tensor_path(torch, kw, pad, mode):
    """In eval under no_grad, with an encoder of layers torch runs on nested tensors and a left-aligned padding mask
    (or mask_check=False), torch returns the padded positions as 0 before the final norm; runtime does the same, and
    warns as torch does when the layers rule that path out."""
    import contextlib

    ours, ours_warned = _padded_encoder(runtime, **kw)
    theirs, theirs_warned = _padded_encoder(torch, **kw)
    assert ours_warned == theirs_warned and ours.use_nested_tensor == theirs.use_nested_tensor
    if kw.get("mask_check") is False and pad is SCATTERED:
        # torch then reads the mask as a length per row (misuse); runtime computes with the mask as given
        theirs, _ = _padded_encoder(torch, enable_nested_tensor=False)
    ours.load_state_dict({k: runtime.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    if mode != "train":
        ours.eval(), theirs.eval()
    x = _x(N, L, E).astype(np.float32)
    if kw.get("batch_first", True) is False:
        x = x.transpose(1, 0, 2).copy()
    quiet = contextlib.ExitStack()
    if mode == "no_grad":
        quiet.enter_context(runtime.no_grad())
        quiet.enter_context(torch.no_grad())
    with quiet, __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")  # torch's "nested tensors are a prototype" notice
        want = theirs(torch.tensor(x), src_key_padding_mask=torch.tensor(pad)).detach().numpy()
        got = ours(runtime.tensor(x), src_key_padding_mask=runtime.tensor(pad)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_compiled_encoder_zeroes_padding_as_eager_does():
    import nnc

    runtime.manual_seed(0)
    encoder, _ = _padded_encoder(runtime)
    encoder.eval()
    compiled = nnc.compile(encoder)
    x = runtime.tensor(_x(N, L, E).astype(np.float32))
    with runtime.no_grad():
        for pad in (ALIGNED, SCATTERED):
            mask = runtime.tensor(pad)
            want, got = encoder(x, src_key_padding_mask=mask), compiled(x, src_key_padding_mask=mask)
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert compiled.compiled_variants == 1  # the left-aligned test is a tensor in the graph, not a guard


def test_compiled_attention_over_a_fully_padded_sequence_matches_eager():
    import nnc

    runtime.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, 2, 16, dropout=0.0, batch_first=True).double()
    compiled = nnc.compile(layer)
    pad = np.zeros((N, L), bool)
    pad[0] = True
    results, data = [], _x(N, L, E)
    for model in (layer, compiled):
        x = runtime.tensor(data, requires_grad=True)
        out = model(x, src_key_padding_mask=runtime.tensor(pad))
        (out * out).sum().backward()
        results.append([out.detach().numpy(), x.grad.numpy()] + [p.grad.numpy().copy() for p in layer.parameters()])
        layer.zero_grad()
    for got, want in zip(results[1], results[0]):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
