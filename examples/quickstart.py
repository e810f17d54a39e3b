"""Quickstart: train a small network eagerly, compile it with nnc.compile, train on, and compare the step times.

    python examples/quickstart.py            # about 10 s with a cold kernel cache, 3 s warm
    python examples/quickstart.py --quick    # a few steps each way (what CI runs)

The model is torch code (`import runtime as torch`): residual blocks of LayerNorm, Linear and GELU classifying
points of three interleaved spirals. Eagerly every op is a numpy call with autograd bookkeeping; compiled, the
forward and the backward run as a few fused numba kernels, with the same parameters and the same results.
"""
import argparse
import math
import statistics
import time

import runtime as torch
from runtime import nn

import nnc

try:
    from tqdm import tqdm
except ImportError:  # the `examples` extra installs it; without it, no progress bar
    def tqdm(iterable, **_):
        return iterable


class Net(nn.Module):
    """Points in the plane -> class scores, through `depth` residual blocks of width `width`."""

    def __init__(self, width=128, depth=2, classes=3):
        super().__init__()
        self.embed = nn.Linear(2, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                     for _ in range(depth)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def spirals(n_per_class=512, classes=3, noise=0.4):
    """Three interleaved spiral arms in the plane; the label is the arm."""
    r = torch.linspace(0.1, 1.0, n_per_class).repeat(classes)
    label = torch.arange(classes).reshape(classes, 1).expand(classes, n_per_class).reshape(-1)
    angle = r * 9.0 + label.float() * (2 * math.pi / classes) + torch.randn(classes * n_per_class) * noise
    points = torch.stack([r * angle.cos(), r * angle.sin()], dim=1) * 2.0
    return points, label


def train(model, points, labels, optimizer, steps, batch, desc):
    """`steps` SGD steps on random batches; returns (seconds per step, each step timed, last loss)."""
    loss_fn = nn.CrossEntropyLoss()
    times, loss = [], None
    for _ in (tqdm(range(steps), desc=desc, unit="step") if desc else range(steps)):
        index = torch.randint(0, len(points), (batch,))
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(points[index]), labels[index])
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times, loss.item()


def accuracy(model, points, labels):
    with torch.no_grad():
        return (model(points).argmax(1) == labels).float().mean().item()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps each way (a smoke run)")
    parser.add_argument("--steps", type=int, default=300, help="training steps eagerly, then as many compiled")
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)
    steps = 10 if args.quick else args.steps

    torch.manual_seed(0)
    points, labels = spirals()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters; data: {len(points)} points, "
          f"{int(labels.max()) + 1} classes")

    # 1. eager: every op runs on numpy as it is called, with autograd recording the backward
    _, loss = train(model, points, labels, optimizer, steps, args.batch, "eager   ")
    print(f"eager:    loss {loss:.3f}, accuracy {accuracy(model, points, labels):.1%}")

    # 2. compile: the same module, parameters shared; the first call traces it and generates its kernels
    compiled = nnc.compile(model)
    start = time.perf_counter()
    x, y = points[:args.batch], labels[:args.batch]
    nn.CrossEntropyLoss()(compiled(x), y).backward()
    optimizer.zero_grad()
    compile_seconds = time.perf_counter() - start
    if compiled.compiled_variants == 0:
        raise SystemExit("nnc could not compile the model (see the warning above); it ran eagerly")
    difference = (compiled(x) - model(x)).detach().abs().max().item()   # the training variant, no new compile
    print(f"compile:  {compile_seconds:.1f} s on the first call (kernels cached on disk for the next run); "
          f"compiled vs eager output differs by at most {difference:.1e}")

    # 3. compiled: train on, with the same optimizer and the same parameters
    _, loss = train(compiled, points, labels, optimizer, steps, args.batch, "compiled")
    print(f"compiled: loss {loss:.3f}, accuracy {accuracy(model, points, labels):.1%}")   # shared parameters

    # what a step costs each way: more steps, alternating eager and compiled, so that whatever else the machine is
    # doing meanwhile slows both alike (the median of each side)
    rounds = 5 if args.quick else 100
    eager_times, compiled_times = [], []
    for _ in range(rounds):
        eager_times += train(model, points, labels, optimizer, 1, args.batch, None)[0]
        compiled_times += train(compiled, points, labels, optimizer, 1, args.batch, None)[0]
    eager_step, compiled_step = statistics.median(eager_times), statistics.median(compiled_times)
    report = nnc.explain(model, x, backward=True)
    ratio = eager_step / compiled_step
    print()
    print(f"time per training step (batch {args.batch}, median of {rounds} steps each way, alternating):")
    print(f"  eager     {eager_step * 1e3:7.3f} ms")
    print(f"  compiled  {compiled_step * 1e3:7.3f} ms   " +
          (f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower (is the machine busy?)"))
    print(f"kernels: {len(report.kernels)} forward + {len(report.backward_kernels)} backward, "
          f"generated by numba from {len(list(model.modules())) - 1} modules")
    print()
    print("where to look next:")
    print("  nnc.explain(model, x, backward=True)   # the kernels and why each boundary is there")
    print("  nnc dump examples/models.py:mlp --input 'float32[8,784]' --stage fuse   # any compiler stage")
    print("  nnc report examples/models.py:block --input 'float32[2,5,32]' -o report.html   # a page to open")
    return eager_step, compiled_step


if __name__ == "__main__":
    main()
