"""Quickstart: tensors, autograd and a tiny MLP trained with hand-written SGD, via `import runtime as torch`."""
import runtime as torch

torch.manual_seed(0)

# Tensors behave like torch's, with broadcasting and dtype promotion.
a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
b = (a * a + 1).sum()
b.backward()
print("a =", a)
print("d/da sum(a*a + 1) =", a.grad)

# A two-layer network on a toy problem: classify points by the sign of x0 * x1.
x = torch.randn(256, 2)
y = ((x[:, 0] * x[:, 1]) > 0).long()
w1 = (torch.randn(2, 32) * 0.5).requires_grad_()
b1 = torch.zeros(32, requires_grad=True)
w2 = (torch.randn(32, 2) * 0.5).requires_grad_()
b2 = torch.zeros(2, requires_grad=True)
rows = torch.arange(256)

for step in range(201):
    logits = (x @ w1 + b1).relu() @ w2 + b2
    loss = -logits.log_softmax(1)[rows, y].mean()
    loss.backward()
    with torch.no_grad():
        for p in (w1, b1, w2, b2):
            p -= 0.5 * p.grad
            p.grad = None
    if step % 50 == 0:
        accuracy = (logits.argmax(1) == y).float().mean().item()
        print(f"step {step:3d}  loss {loss.item():.4f}  accuracy {accuracy:.2%}")
