"""Handwritten digits (scikit-learn's bundled 8x8 images, no download): one classifier trained eagerly and its twin
trained compiled from the same initial weights, with a PNG of both runs' loss and accuracy curves.

    python examples/digits.py                      # 20 epochs each way, writes digits.png
    python examples/digits.py --quick -o /tmp/d.png   # 2 epochs (what CI runs)

Needs the `examples` extra (scikit-learn, matplotlib, tqdm): pip install -e ".[examples]".
"""
import argparse
import copy
import time

import numpy as np

import runtime as torch
from runtime import nn

import nnc

try:
    from tqdm import tqdm
except ImportError:
    def tqdm(iterable, **_):
        return iterable


class DigitNet(nn.Module):
    """A small CNN: 1x8x8 image -> two 3x3 convolutions -> a linear head over 10 digits."""

    def __init__(self, channels=16, hidden=64):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))   # channels x 4 x 4
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(channels * 16, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.head(self.features(x))


def load(test_fraction=0.25, seed=0):
    """(train images, train labels, test images, test labels) as runtime tensors, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]   # N x 1 x 8 x 8
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(len(images) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    as_tensor = torch.from_numpy
    return (as_tensor(images[train]), as_tensor(digits.target[train].astype(np.int64)),
            as_tensor(images[test]), as_tensor(digits.target[test].astype(np.int64)))


def run(model, data, epochs, batch, label, seed=0):
    """Train `model` for `epochs`; returns per-epoch {loss, train_acc, test_acc, seconds}."""
    x_train, y_train, x_test, y_test = data
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    generator = np.random.default_rng(seed)
    n_batches = len(x_train) // batch   # whole batches only: one shape, so one compiled variant
    history = []
    bar = tqdm(total=epochs * n_batches, desc=label, unit="batch")
    for _ in range(epochs):
        order = generator.permutation(len(x_train))
        losses, correct, start = [], 0, time.perf_counter()
        model.train()
        for b in range(n_batches):
            index = torch.from_numpy(order[b * batch:(b + 1) * batch])
            x, y = x_train[index], y_train[index]
            optimizer.zero_grad()
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            correct += (logits.argmax(1) == y).sum().item()
            if hasattr(bar, "update"):
                bar.update(1)
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            test_acc = (model(x_test).argmax(1) == y_test).float().mean().item()
        history.append({"loss": float(np.mean(losses)), "train_acc": correct / (n_batches * batch),
                        "test_acc": test_acc, "seconds": seconds})
    if hasattr(bar, "close"):
        bar.close()
    return history


def plot(histories: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")   # files only, no window
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for (label, history), style, color in zip(histories.items(), ("-", "--"), ("tab:blue", "tab:orange")):
        epochs = range(1, len(history) + 1)
        left.plot(epochs, [h["loss"] for h in history], style, color=color, label=label)
        right.plot(epochs, [h["test_acc"] for h in history], style, color=color, label=f"{label}, test")
        right.plot(epochs, [h["train_acc"] for h in history], style, color=color, alpha=0.4, label=f"{label}, train")
    left.set(xlabel="epoch", ylabel="training loss", title="loss (mean over the epoch)")
    right.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    left.legend()
    right.legend()
    fig.suptitle("scikit-learn digits: eager and nnc.compile from the same initial weights")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="2 epochs each way (a smoke run)")
    parser.add_argument("-o", "--out", default="digits.png", help="where the curves go (PNG)")
    args = parser.parse_args(argv)
    epochs = 2 if args.quick else args.epochs

    torch.manual_seed(0)
    data = load()
    print(f"digits: {len(data[0])} training and {len(data[2])} test images, 8x8")
    eager = DigitNet()
    twin = copy.deepcopy(eager)   # same initial weights
    histories = {"eager": run(eager, data, epochs, args.batch, "eager   ")}
    histories["compiled"] = run(nnc.compile(twin), data, epochs, args.batch, "compiled")
    for label, history in histories.items():
        # the first epoch includes the compile (cold: seconds; the kernel cache makes the next run's fast)
        later = [h["seconds"] for h in history[1:]] or [history[0]["seconds"]]
        print(f"{label:8s}: test accuracy {history[-1]['test_acc']:.1%}, final loss {history[-1]['loss']:.4f}, "
              f"{np.median(later):.2f} s per epoch after the first ({history[0]['seconds']:.2f} s)")
    plot(histories, args.out)
    print(f"curves: {args.out}")
    return histories


if __name__ == "__main__":
    main()
