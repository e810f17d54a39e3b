"""Models in the shapes real training scripts have: a GPT, an LSTM language model, and one with a data-dependent branch.

Written for this project (not copied) after the programs people train: a decoder-only GPT with an assert on sizes,
`1 / sqrt(head_dim)`, a causal-mask buffer, tied embeddings and a generate loop; a word-level LSTM language model
with a tuple hidden state, `init_hidden` and tied weights; and a model whose one submodule branches on tensor values.
"""
import math
from dataclasses import dataclass

import runtime as torch
import runtime.nn.functional as F
from runtime import nn


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask held as a (1, 1, T, T) buffer."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        mask = torch.tril(torch.ones(config.block_size, config.block_size))
        self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only transformer: forward(idx, targets=None) -> (logits, loss), with the lm head tied to wte."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of length {t} is longer than block size {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position
            loss = None
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k=None):
        """Append max_new_tokens tokens, each sampled from the model's distribution given the tokens so far."""
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


class LSTMCell(nn.Module):
    """One LSTM step: (x, (h, c)) -> (h, c), with torch's gate order (input, forget, cell, output)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.ih = nn.Linear(input_size, 4 * hidden_size)
        self.hh = nn.Linear(hidden_size, 4 * hidden_size)

    def forward(self, x, state):
        h, c = state
        i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c


class RNNModel(nn.Module):
    """A word-level language model: embedding, an LSTM over time, a decoder tied to the embedding."""

    def __init__(self, ntoken: int = 50, ninp: int = 16, nlayers: int = 2, dropout: float = 0.0,
                 tie_weights: bool = True):
        super().__init__()
        self.ntoken, self.nhid, self.nlayers = ntoken, ninp, nlayers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.cells = nn.ModuleList([LSTMCell(ninp, ninp) for _ in range(nlayers)])
        self.decoder = nn.Linear(ninp, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, input, hidden):
        """input: (seq_len, batch) token ids; hidden: (h, c), each (nlayers, batch, nhid)."""
        emb = self.drop(self.encoder(input))
        h0, c0 = hidden
        hs, cs = list(h0.unbind(0)), list(c0.unbind(0))
        outputs = []
        for step in range(input.size(0)):
            x = emb[step]
            for layer, cell in enumerate(self.cells):
                hs[layer], cs[layer] = cell(x, (hs[layer], cs[layer]))
                x = hs[layer]
            outputs.append(x)
        output = self.drop(torch.stack(outputs, 0))
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), (torch.stack(hs, 0), torch.stack(cs, 0))

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros((self.nlayers, bsz, self.nhid)), weight.new_zeros((self.nlayers, bsz, self.nhid)))


class Gate(nn.Module):
    """Data-dependent Python control flow: scales its input down when its mean is large (cannot be traced)."""

    def forward(self, x):
        if x.abs().mean() > 1.0:
            return x * 0.5
        return x


class GatedMLP(nn.Module):
    """Linear layers around a Gate: the layers compile, the Gate runs eagerly."""

    def __init__(self, features: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(features, 16)
        self.gate = Gate()
        self.fc2 = nn.Linear(16, features)

    def forward(self, x):
        return self.fc2(self.gate(torch.tanh(self.fc1(x))))


def gpt(config: GPTConfig | None = None) -> GPT:
    return GPT(config or GPTConfig())
