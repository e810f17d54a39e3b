"""Programs shaped like well-known public training scripts, written against a module named `torch` and run twice:
with `runtime` as that module (the drop-in use, `import runtime as torch`) and with torch itself, from the same
initial weights (torch's state_dict), in float64; their losses must agree.

The programs are our own small copies of the shapes issue 15 names: an MNIST-example CNN (Adadelta, StepLR,
DataLoader, torch.accelerator), the word-language-model example (a `TransformerModel(nn.Transformer)` and an RNN
model with tied weights, batchify/get_batch/repackage_hidden, clip_grad_norm_, manual SGD), and a nanoGPT-train.py
loop (allow_tf32 flags, nullcontext/autocast(enabled=False), GradScaler(enabled=False), AdamW with decay only on
2-D parameters, a hand-set cosine learning rate, estimate_loss under no_grad).
"""
from __future__ import annotations

import copy
import inspect
import math
from contextlib import nullcontext

import numpy as np
import pytest

import runtime
from helpers import needs_torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """torch's OpenMP threads spin when the cores are shared (a busy CI box): one thread keeps these runs fast."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


_INITIAL = {}  # the torch model of a reference run at its initial weights, for the runtime run to start from


def _start(torch, model, init_from):
    """Load the reference's initial weights into `model` (through numpy), or keep a copy of this reference's."""
    if init_from is not None:
        model.load_state_dict({k: torch.tensor(v.detach().numpy().copy()) for k, v in
                               init_from.state_dict().items()})
    else:
        _INITIAL["model"] = copy.deepcopy(model)


# --- an MNIST-example-shaped CNN ---------------------------------------------------------------------------------

def mnist_program(torch, init_from=None, epochs=2, dropout=(0.25, 0.5), shuffle=False):
    nn, F, optim = torch.nn, torch.nn.functional, torch.optim
    from_lr = torch.optim.lr_scheduler.StepLR

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 4, 3, 1)
            self.conv2 = nn.Conv2d(4, 8, 3, 1)
            self.dropout1 = nn.Dropout(dropout[0])
            self.dropout2 = nn.Dropout(dropout[1])
            self.fc1 = nn.Linear(200, 32)
            self.fc2 = nn.Linear(32, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            x = F.max_pool2d(x, 2)
            x = self.dropout1(x)
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            x = self.dropout2(x)
            return F.log_softmax(self.fc2(x), dim=1)

    use_accel = torch.accelerator.is_available()
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    gen = np.random.default_rng(0)
    images = torch.tensor(gen.standard_normal((64, 1, 14, 14)))
    labels = torch.tensor(gen.integers(0, 10, 64))
    train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images[:48], labels[:48]),
                                               batch_size=16, shuffle=shuffle)
    test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images[48:], labels[48:]),
                                              batch_size=8)
    model = Net().double().to(device)
    _start(torch, model, init_from)
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = from_lr(optimizer, step_size=1, gamma=0.7)
    losses, tests = [], []
    for _ in range(epochs):
        model.train()
        for data, target in train_loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data.to(device))
                test_loss += F.nll_loss(output, target.to(device), reduction="sum").item()
                pred = output.argmax(dim=1, keepdim=True)
                correct += pred.eq(target.view_as(pred)).sum().item()
        tests.append((test_loss / len(test_loader.dataset), correct))
        scheduler.step()
    return model, losses, tests, optimizer.param_groups[0]["lr"]


@needs_torch
def test_mnist_shaped_program_matches_torch(torch):
    torch.manual_seed(0)
    reference = mnist_program(torch, dropout=(0.0, 0.0))
    runtime.manual_seed(0)
    got = mnist_program(runtime, init_from=_INITIAL.pop("model"), dropout=(0.0, 0.0))
    np.testing.assert_allclose(got[1], reference[1], rtol=1e-8)
    np.testing.assert_allclose([t[0] for t in got[2]], [t[0] for t in reference[2]], rtol=1e-8)
    assert [t[1] for t in got[2]] == [t[1] for t in reference[2]] and got[3] == pytest.approx(reference[3])


def test_mnist_shaped_program_runs_with_dropout_and_shuffling():
    runtime.manual_seed(0)
    _, losses, tests, lr = mnist_program(runtime, epochs=1, shuffle=True)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses) and lr == pytest.approx(0.7)


# --- a word-language-model-shaped script ---------------------------------------------------------------------------

def word_lm_program(torch, model_type, init_from=None, steps=3, dropout=0.0):
    nn, F = torch.nn, torch.nn.functional

    class RNNModel(nn.Module):
        def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
            super().__init__()
            self.ntoken = ntoken
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(ntoken, ninp)
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
            self.decoder = nn.Linear(nhid, ntoken)
            if tie_weights:
                if nhid != ninp:
                    raise ValueError("When using the tied flag, nhid must be equal to emsize")
                self.decoder.weight = self.encoder.weight
            initrange = 0.1
            nn.init.uniform_(self.encoder.weight, -initrange, initrange)
            nn.init.zeros_(self.decoder.bias)
            self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

        def forward(self, input, hidden):
            emb = self.drop(self.encoder(input))
            output, hidden = self.rnn(emb, hidden)
            decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
            return F.log_softmax(decoded, dim=1), hidden

        def init_hidden(self, bsz):
            weight = next(self.parameters())
            if self.rnn_type == "LSTM":
                return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
            return weight.new_zeros(self.nlayers, bsz, self.nhid)

    class PositionalEncoding(nn.Module):
        def __init__(self, d_model, dropout=0.1, max_len=64):
            super().__init__()
            self.dropout = nn.Dropout(p=dropout)
            pe = torch.zeros(max_len, d_model)
            position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
            pe[:, 0::2] = torch.sin(position * div_term)
            pe[:, 1::2] = torch.cos(position * div_term)
            self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

        def forward(self, x):
            return self.dropout(x + self.pe[:x.size(0), :])

    class TransformerModel(nn.Transformer):
        def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
            super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers,
                             dropout=dropout)
            self.src_mask = None
            self.pos_encoder = PositionalEncoding(ninp, dropout)
            self.input_emb = nn.Embedding(ntoken, ninp)
            self.ninp = ninp
            self.decoder = nn.Linear(ninp, ntoken)
            nn.init.uniform_(self.input_emb.weight, -0.1, 0.1)
            nn.init.zeros_(self.decoder.bias)
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

        def _generate_square_subsequent_mask(self, sz):
            return torch.log(torch.tril(torch.ones(sz, sz)))

        def forward(self, src, has_mask=True):
            if has_mask:
                if self.src_mask is None or self.src_mask.size(0) != len(src):
                    self.src_mask = self._generate_square_subsequent_mask(len(src)).to(src.device).double()
            else:
                self.src_mask = None
            src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
            output = self.decoder(self.encoder(src, mask=self.src_mask))
            return F.log_softmax(output, dim=-1)

    device = torch.device("cpu")
    ntokens, bptt, clip, lr = 20, 5, 0.25, 2.0

    def batchify(data, bsz):
        nbatch = data.size(0) // bsz
        data = data.narrow(0, 0, nbatch * bsz)
        return data.view(bsz, -1).t().contiguous().to(device)

    def get_batch(source, i):
        seq_len = min(bptt, len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)

    def repackage_hidden(h):
        if isinstance(h, torch.Tensor):
            return h.detach()
        return tuple(repackage_hidden(v) for v in h)

    corpus = torch.tensor(np.random.default_rng(1).integers(0, ntokens, 200))
    train_data, val_data = batchify(corpus[:160], 4), batchify(corpus[160:], 2)
    if model_type == "Transformer":
        model = TransformerModel(ntokens, 8, 2, 16, 2, dropout).double()
    else:
        model = RNNModel(model_type, ntokens, 8, 8, 2, dropout, tie_weights=True).double()
    _start(torch, model, init_from)
    criterion = nn.NLLLoss()

    def evaluate(data_source):
        model.eval()
        total = 0.0
        hidden = None if model_type == "Transformer" else model.init_hidden(2)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, bptt):
                data, targets = get_batch(data_source, i)
                if model_type == "Transformer":
                    output = model(data).view(-1, ntokens)
                else:
                    output, hidden = model(data, hidden)
                    hidden = repackage_hidden(hidden)
                total += len(data) * criterion(output, targets).item()
        return total / (len(data_source) - 1)

    model.train()
    losses = []
    hidden = None if model_type == "Transformer" else model.init_hidden(4)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        if batch == steps:
            break
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        if model_type == "Transformer":
            output = model(data).view(-1, ntokens)
        else:
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses, evaluate(val_data)


@needs_torch
@pytest.mark.parametrize("model_type", ["LSTM", "GRU", "Transformer"])
def test_word_language_model_shaped_script_matches_torch(torch, model_type):
    torch.manual_seed(0)
    reference = word_lm_program(torch, model_type)
    got = word_lm_program(runtime, model_type, init_from=_INITIAL.pop("model"))
    np.testing.assert_allclose(got[0], reference[0], rtol=1e-8)
    assert got[1] == pytest.approx(reference[1], rel=1e-8)


def test_word_language_model_shaped_script_trains_with_dropout():
    runtime.manual_seed(0)
    losses, val = word_lm_program(runtime, "LSTM", steps=2, dropout=0.2)
    _INITIAL.clear()
    assert len(losses) == 2 and math.isfinite(val)


# --- a nanoGPT-train.py-shaped loop --------------------------------------------------------------------------------

def nanogpt_program(torch, init_from=None, max_iters=4):
    nn, F = torch.nn, torch.nn.functional
    n_layer, n_head, n_embd, block_size, vocab_size, batch_size = 2, 2, 16, 8, 24, 4

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                                 .view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(n_embd, dim=2)
            k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
            q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
            v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(n_embd), CausalSelfAttention(), nn.LayerNorm(n_embd)
            self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd), act=nn.GELU(),
                                          c_proj=nn.Linear(4 * n_embd, n_embd)))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            m = self.mlp
            return x + m.c_proj(m.act(m.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(vocab_size, n_embd),
                                                  wpe=nn.Embedding(block_size, n_embd),
                                                  h=nn.ModuleList([Block() for _ in range(n_layer)]),
                                                  ln_f=nn.LayerNorm(n_embd)))
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight
            self.apply(self._init_weights)
            for pn, p in self.named_parameters():
                if pn.endswith("c_proj.weight"):
                    torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets=None):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                                                ignore_index=-1)
            return logits, loss

        def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
            param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
            decay_params = [p for p in param_dict.values() if p.dim() >= 2]
            nodecay_params = [p for p in param_dict.values() if p.dim() < 2]
            groups = [{"params": decay_params, "weight_decay": weight_decay},
                      {"params": nodecay_params, "weight_decay": 0.0}]
            use_fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
            extra = dict(fused=True) if use_fused else dict()
            return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)

        @torch.no_grad()
        def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
            for _ in range(max_new_tokens):
                logits, _ = self(idx[:, -block_size:])
                logits = logits[:, -1, :] / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
                idx = torch.cat((idx, idx_next), dim=1)
            return idx

    learning_rate, min_lr, warmup_iters, lr_decay_iters, grad_clip, eval_iters = 1e-2, 1e-3, 2, 6, 1.0, 2
    gradient_accumulation_steps, dtype, device = 2, "float32", "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    device_type = "cuda" if "cuda" in device else "cpu"
    ptdtype = {"float32": torch.float32, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
    amp_off = torch.amp.autocast(device_type="cpu", enabled=False)
    data = {s: np.random.default_rng(k).integers(0, vocab_size, 300).astype(np.uint16)
            for k, s in enumerate(("train", "val"))}
    draws = np.random.default_rng(7)

    def get_batch(split):
        d = data[split]
        ix = draws.integers(0, len(d) - block_size, batch_size)
        x = torch.stack([torch.from_numpy(d[i:i + block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(d[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
        return x.to(device), y.to(device)

    model = GPT().double()
    _start(torch, model, init_from)
    scaler = torch.amp.GradScaler(enabled=(dtype == "float16"))
    optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), device_type)

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                with ctx:
                    _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)

    X, Y = get_batch("train")
    history = []
    for iter_num in range(max_iters):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % 2 == 0:
            history.append(estimate_loss())
        for _ in range(gradient_accumulation_steps):
            with ctx, amp_off:
                _, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")
            scaler.scale(loss).backward()
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        history.append(loss.item() * gradient_accumulation_steps)
    sample = model.generate(torch.zeros((1, 1), dtype=torch.long), 4, top_k=5)
    return history, tuple(sample.shape)


@needs_torch
def test_nanogpt_train_shaped_loop_matches_torch(torch):
    torch.manual_seed(0)
    reference = nanogpt_program(torch)
    got = nanogpt_program(runtime, init_from=_INITIAL.pop("model"))
    assert got[1] == reference[1] == (1, 5)
    for a, b in zip(got[0], reference[0]):
        if isinstance(b, dict):
            assert a == pytest.approx(b, rel=1e-8)
        else:
            assert a == pytest.approx(b, rel=1e-8)
