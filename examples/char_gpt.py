"""A character-level GPT trained, compiled, on the Python standard library's own source code (on every machine that
has Python), then asked to write some Python.

    python examples/char_gpt.py                 # 1500 steps of 8 windows: 5 minutes on 2 busy cores
    python examples/char_gpt.py --quick         # a tiny model, a few steps (what CI runs)

The model is a decoder-only transformer written here with `runtime.nn` (token and position embeddings, pre-norm
blocks of causal self-attention and an MLP, a tied output layer). Training runs through nnc.compile; sampling
feeds the model a window of fixed length, so one compiled inference variant serves every new character.
"""
import argparse
import math
import os
import string
import sys
import time

import numpy as np

import runtime as torch
from runtime import nn
from runtime.nn import functional as F

import nnc

try:
    from tqdm import tqdm
except ImportError:
    tqdm = None

# A fixed alphabet (printable ASCII), so a checkpoint means the same on any machine; anything else becomes '?'.
ALPHABET = sorted(set(string.printable) - set("\x0b\x0c\r"))
INDEX = {c: i for i, c in enumerate(ALPHABET)}


def encode(text: str) -> np.ndarray:
    unknown = INDEX["?"]
    return np.array([INDEX.get(c, unknown) for c in text], dtype=np.int64)


def decode(ids) -> str:
    return "".join(ALPHABET[int(i)] for i in ids)


def stdlib_text(limit: int) -> str:
    """Up to `limit` characters of the standard library's top-level modules, in name order."""
    folder = os.path.dirname(os.__file__)
    parts, size = [], 0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py") or name.startswith("_"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        size += len(parts[-1])
        if size >= limit:
            break
    return "".join(parts)[:limit]


class SelfAttention(nn.Module):
    """Multi-head attention in which each position sees itself and the positions before it."""

    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.register_buffer("future", torch.ones(context, context).triu(1).bool(), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        scores = scores.masked_fill(self.future[:t, :t], float("-inf"))
        y = scores.softmax(dim=-1) @ v                                   # b, heads, t, c / heads
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = SelfAttention(width, heads, context)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CharGPT(nn.Module):
    """Token ids (batch, time) -> next-character logits (batch, time, alphabet)."""

    def __init__(self, vocab, context=64, width=64, depth=2, heads=4):
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads, context) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight   # the output layer reads the embedding table (tied weights)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(data: np.ndarray, batch: int, context: int, rng):
    """Endless (inputs, targets) pairs of random windows; targets are the inputs shifted by one character."""
    while True:
        starts = rng.integers(0, len(data) - context - 1, size=batch)
        windows = np.stack([data[s:s + context + 1] for s in starts])
        yield torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())


def step(model, optimizer, x, y):
    optimizer.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def sample(model, prompt: np.ndarray, length: int, temperature: float = 0.8) -> str:
    """`length` new characters after `prompt` (exactly `model.context` ids: the input shape never changes)."""
    window = torch.from_numpy(prompt[None, :].copy())
    new = []
    for _ in range(length):
        logits = model(window)[0, -1] / temperature
        next_id = torch.multinomial(logits.softmax(-1), 1)
        new.append(int(next_id.item()))
        window = torch.cat([window[:, 1:], next_id.reshape(1, 1)], dim=1)
    return decode(new)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    # NOTE: at batch 16 a compiled step was 10-20x slower than at 8 on 2 cores (650 vs 27 ms): the weight-gradient
    # matmuls run in OpenBLAS beside parallel numba kernels and the two thread pools contend (docs/architecture.md,
    # known gaps). Batch 8 keeps the kernels serial.
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--chars", type=int, default=400_000, help="how much standard library text to read")
    parser.add_argument("--sample", type=int, default=300, help="characters to write at the end")
    parser.add_argument("--quick", action="store_true", help="a tiny model and a few steps (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.chars, args.sample = 8, 20_000, 40
        sizes = dict(context=16, width=32, depth=1, heads=2)
    else:
        sizes = dict(context=64, width=64, depth=2, heads=4)

    torch.manual_seed(0)
    data = encode(stdlib_text(args.chars))
    split = int(0.9 * len(data))
    train, held_out = data[:split], data[split:]
    model = CharGPT(len(ALPHABET), **sizes)
    print(f"text: {len(data):,} characters of {os.path.dirname(os.__file__)}/*.py; "
          f"model: {sum(p.numel() for p in model.parameters()):,} parameters, context {model.context}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(0)
    stream = batches(train, args.batch, model.context, rng)

    # a few eager steps, to compare with (after one that warms caches up)
    step(model, optimizer, *next(stream))
    eager_times = []
    for _ in range(2 if args.quick else 5):
        start = time.perf_counter()
        step(model, optimizer, *next(stream))
        eager_times.append(time.perf_counter() - start)

    compiled = nnc.compile(model)
    start = time.perf_counter()
    step(compiled, optimizer, *next(stream))
    print(f"compiled the training step in {time.perf_counter() - start:.1f} s")
    times, losses = [], []
    progress = tqdm(range(args.steps), desc="training", unit="step", file=sys.stderr) if tqdm else range(args.steps)
    for i in progress:
        start = time.perf_counter()
        losses.append(step(compiled, optimizer, *next(stream)))
        times.append(time.perf_counter() - start)
        if tqdm and i % 10 == 0:
            progress.set_postfix(loss=f"{np.mean(losses[-10:]):.3f}")
    compiled.eval()
    x, y = next(batches(held_out, args.batch, model.context, rng))
    with torch.no_grad():
        logits = compiled(x)
        held_out_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    print(f"loss: {losses[0]:.3f} at the first compiled step, {np.mean(losses[-10:]):.3f} at the end; "
          f"held-out {held_out_loss:.3f} (uniform guessing: {math.log(len(ALPHABET)):.3f})")
    print(f"time per step: eager {np.median(eager_times) * 1e3:.1f} ms, compiled {np.median(times) * 1e3:.1f} ms")
    prompt = held_out[:model.context]
    text = sample(compiled, prompt, args.sample)
    print("--- sample (prompt, then the model's continuation) ---")
    print(decode(prompt) + text)
    print("--- end of sample ---")
    return text


if __name__ == "__main__":
    main()
