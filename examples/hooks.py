"""Hooks under nnc.compile: capture activations with forward hooks, clip gradients with tensor hooks, watch gradients
flow with a full backward hook; the compiled model fires them exactly as eager does.

    python examples/hooks.py            # 200 steps
    python examples/hooks.py --quick    # 5 steps (what CI runs)

A module with hooks stays a call in the compiled graph (its hooks need real tensors) while the rest is fused; once
the hooks are removed, the next call recompiles (the guards watch which modules have hooks) into kernels only.
"""
import argparse
import copy
import time

import numpy as np

import runtime as torch
from runtime import nn

import nnc

CLIP = 0.05


def make_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


class Probe:
    """Forward hooks that keep each ReLU's latest output and the share of its units that were zero; a full backward
    hook on the last layer that keeps the norm of the gradient arriving at its output; tensor hooks that clamp every
    parameter's gradient to [-CLIP, CLIP] and count how many entries they clipped."""

    def __init__(self, model):
        self.activations, self.dead, self.grad_norms, self.clipped = {}, {}, [], [0, 0]
        self.handles = []
        for name, module in model.named_children():
            if isinstance(module, nn.ReLU):
                self.handles.append(module.register_forward_hook(self._capture(f"relu{name}")))
        self.handles.append(model[-1].register_full_backward_hook(self._grad_norm))
        for p in model.parameters():
            self.handles.append(p.register_hook(self._clip))

    def _capture(self, name):
        def hook(module, inputs, output):
            self.activations[name] = output.detach().clone()
            self.dead.setdefault(name, []).append((output == 0).float().mean().item())
        return hook

    def _grad_norm(self, module, grad_input, grad_output):
        self.grad_norms.append((grad_output[0] ** 2).sum().sqrt().item())

    def _clip(self, grad):
        self.clipped[0] += (grad.abs() > CLIP).sum().item()
        self.clipped[1] += grad.numel()
        return grad.clamp(-CLIP, CLIP)

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []


def train(model, steps, data, label):
    x, y = data
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    times = []
    for i in range(steps):
        batch = slice((i * 64) % 1024, (i * 64) % 1024 + 64)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = ((model(x[batch]) - y[batch]) ** 2).mean()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return loss.item(), float(np.median(times[1:] or times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="5 steps (a smoke run)")
    args = parser.parse_args(argv)
    steps = 5 if args.quick else args.steps

    torch.manual_seed(0)
    x = torch.randn(1024, 16)
    y = (x[:, :4].sum(1, keepdim=True) * 0.5).sin() + 0.1 * torch.randn(1024, 1)
    eager = make_model()
    twin = copy.deepcopy(eager)
    eager_probe, compiled_probe = Probe(eager), Probe(twin)
    compiled = nnc.compile(twin)

    eager_loss, eager_step = train(eager, steps, (x, y), "eager")
    compiled_loss, hooked_step = train(compiled, steps, (x, y), "compiled")
    print(f"after {steps} steps: loss eager {eager_loss:.5f}, compiled {compiled_loss:.5f}; "
          f"{eager_step * 1e3:.3f} ms per eager step with the hooks")

    # the hooks saw the same tensors in both runs
    for name, value in eager_probe.activations.items():
        difference = (compiled_probe.activations[name] - value).abs().max().item()
        print(f"  {name}: {np.mean(compiled_probe.dead[name]):.0%} of units at zero on average; "
              f"captured activations differ from eager's by {difference:.1e}")
    grads = np.array(compiled_probe.grad_norms)
    print(f"  gradient norm at the output layer: {grads[0]:.3f} at the first step, {grads[-1]:.3f} at the last "
          f"(eager: {eager_probe.grad_norms[-1]:.3f})")
    clipped, total = compiled_probe.clipped
    largest = max(p.grad.abs().max().item() for p in twin.parameters())
    print(f"  tensor hooks clipped {clipped:,} of {total:,} gradient entries to +-{CLIP}; "
          f"largest |grad| now {largest:.4f}")
    assert largest <= CLIP + 1e-7

    report = nnc.explain(twin, x[:64], backward=True)
    print(f"with hooks: {len(report.opaque_nodes)} modules run as calls, {report.pieces} compiled pieces between "
          f"them; {hooked_step * 1e3:.3f} ms per step")

    # without hooks the guards see a different model: the next call recompiles into kernels only
    compiled_probe.remove()
    variants = compiled.compiled_variants
    _, plain_step = train(compiled, steps, (x, y), "compiled, no hooks")
    report = nnc.explain(twin, x[:64], backward=True)
    print(f"hooks removed: recompiled ({compiled.compiled_variants - variants} new variant), "
          f"{len(report.kernels)} forward + {len(report.backward_kernels)} backward kernels, "
          f"{len(report.opaque_nodes)} calls; {plain_step * 1e3:.3f} ms per step")
    return eager_probe, compiled_probe


if __name__ == "__main__":
    main()
