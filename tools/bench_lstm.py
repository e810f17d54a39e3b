"""Benchmark an LSTM language model (the word-LM example's shape) in runtime eager, nnc.compile and torch eager.

    python tools/bench_lstm.py [--quick] [--threads N] [--repeats R]

The model: Embedding(10000, 256) -> nn.LSTM(256, 256, num_layers=2) -> Linear(256, 10000), tied weights, at
sequence length 35 and batch 20 (the example's defaults but for the hidden size). Two cases, each with the same
initial weights in all three variants:
  - train: one step (zero_grad, forward, NLL loss of log_softmax, backward, clip_grad_norm_(0.25), SGD step);
  - infer: one forward under no_grad.
The repeats of the three variants are interleaved (runtime, compiled, torch, runtime, ...) so a burst of load on a
shared machine hits all alike. Prints the median per variant, the spread of the repeats (min to max) and the
ratios to torch's fused LSTM (torch eager runs ATen's LSTM kernel, one call per layer). Asserts nothing.
--threads N sets numpy's BLAS, numba's and torch's thread counts alike (before they load).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __name__ == "__main__":  # before numpy/torch/numba load: they read thread counts once
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from thread_flag import apply_threads_flag

    apply_threads_flag(sys.argv[1:], ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                      "NUMBA_NUM_THREADS"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import nnc
import runtime

try:
    import torch
except ImportError:
    torch = None

NTOKENS, HIDDEN, LAYERS, SEQ, BATCH = 10000, 256, 2, 35, 20


def _model(lib, ntokens):
    nn = lib.nn

    class LSTMLanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Embedding(ntokens, HIDDEN)
            self.rnn = nn.LSTM(HIDDEN, HIDDEN, LAYERS)
            self.decoder = nn.Linear(HIDDEN, ntokens)
            self.decoder.weight = self.encoder.weight

        def forward(self, tokens, h0, c0):
            output, _ = self.rnn(self.encoder(tokens), (h0, c0))
            return lib.nn.functional.log_softmax(self.decoder(output), dim=-1)

    return LSTMLanguageModel()


def _variant(lib, state, ntokens, compiled=False):
    model = _model(lib, ntokens)
    model.load_state_dict({k: lib.tensor(v.copy()) for k, v in state.items()})
    run = nnc.compile(model) if compiled else model
    gen = np.random.default_rng(1)
    tokens = lib.tensor(gen.integers(0, ntokens, (SEQ, BATCH)))
    targets = lib.tensor(gen.integers(0, ntokens, SEQ * BATCH))
    h0 = lib.zeros(LAYERS, BATCH, HIDDEN)
    c0 = lib.zeros(LAYERS, BATCH, HIDDEN)
    opt = lib.optim.SGD(model.parameters(), lr=0.1)

    def train():
        opt.zero_grad()
        loss = lib.nn.functional.nll_loss(run(tokens, h0, c0).reshape(-1, ntokens), targets)
        loss.backward()
        lib.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
        return loss.item()

    def infer():
        with lib.no_grad():
            return run(tokens, h0, c0)

    return {"train": train, "infer": infer}


def _time(fn, min_s):
    fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a vocabulary of 1000, 3 repeats: a smoke run")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="threads for BLAS, numba and torch alike")
    args = p.parse_args(argv)
    ntokens = 1000 if args.quick else NTOKENS
    repeats = 3 if args.quick else args.repeats
    if args.threads is not None and torch is not None:
        torch.set_num_threads(args.threads)
    runtime.manual_seed(0)
    state = {k: v.detach().numpy().copy() for k, v in _model(runtime, ntokens).state_dict().items()}
    variants = {"runtime eager": _variant(runtime, state, ntokens),
                "nnc.compile": _variant(runtime, state, ntokens, compiled=True)}
    if torch is not None:
        variants["torch eager"] = _variant(torch, state, ntokens)
    threads = torch.get_num_threads() if torch is not None else os.environ.get("OMP_NUM_THREADS", "default")
    print(f"LSTM LM: vocab {ntokens}, {LAYERS} layers, hidden {HIDDEN}, seq {SEQ}, batch {BATCH}; "
          f"threads {threads}; {repeats} interleaved repeats, median [min-max]")
    first = {name: v["train"]() for name, v in variants.items()}  # also compiles the nnc variant
    print("first training loss: " + ", ".join(f"{k} {v:.6f}" for k, v in first.items()))
    for case in ("train", "infer"):
        times = {name: [] for name in variants}
        for _ in range(repeats):
            for name, v in variants.items():
                times[name].append(_time(v[case], 0.05 if args.quick else 0.3))
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"\n{case}:")
        for name, t in times.items():
            ratio = f"  {med[name] / med['torch eager']:.2f}x torch" if "torch eager" in med else ""
            print(f"  {name:<14} {med[name] * 1e3:8.2f} ms  [{min(t) * 1e3:.2f}-{max(t) * 1e3:.2f}]{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
