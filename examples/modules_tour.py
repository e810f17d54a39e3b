"""A tour of PyTorch's "Modules" note, its code run unchanged with `import runtime as torch`.

The note's modules and functions are in examples/modules_note.py (shared with the tests); this script walks
through the note's uses of them, printing what the note prints.
"""
import os
import tempfile

import runtime as torch
from runtime import nn
from modules_note import (BigNet, DynamicNet, ModalModule, MyLinear, Net, RunningMean, StatefulModule, hooks_demo,
                          init_weights)

torch.manual_seed(0)


def section(title):
    print(f"\n=== {title} ===")


# ---------------------------------------------------------------------------------------------------------------
section("A simple custom module")
# A module subclasses nn.Module, registers state (Parameters) and defines forward().

m = MyLinear(4, 3)
sample_input = torch.randn(4)
print(m(sample_input))          # calling the module runs forward()

for parameter in m.named_parameters():
    print(parameter)

# ---------------------------------------------------------------------------------------------------------------
section("Modules as building blocks: Sequential")
# Sequential feeds each module's output into the next.
net = nn.Sequential(
    MyLinear(4, 3),
    nn.ReLU(),
    MyLinear(3, 1)
)

sample_input = torch.randn(4)
print(net(sample_input))

# ---------------------------------------------------------------------------------------------------------------
section("A custom network: children and modules")

net = Net()
for child in net.named_children():      # immediate children only
    print(child)

big_net = BigNet()
for module in big_net.named_modules():  # recursive, the module itself first
    print(module)

# ---------------------------------------------------------------------------------------------------------------
section("Dynamic submodules: ModuleList and ModuleDict")

dynamic_net = DynamicNet(3)
sample_input = torch.randn(4)
output = dynamic_net(sample_input, 'relu')
print("relu: ", output)
print("lrelu:", dynamic_net(sample_input, 'lrelu'))

# Parameters of submodules are included, with dotted names.
for name, parameter in dynamic_net.named_parameters():
    print(name, tuple(parameter.shape))

# ---------------------------------------------------------------------------------------------------------------
section("Changing precision with to(), custom init with apply()")
# The note also moves to device='cuda' first; here everything stays on the CPU.
dynamic_net.to(dtype=torch.float64)
print(dynamic_net(torch.randn(4, dtype=torch.float64), 'relu'))

# Apply the function recursively on the module and its submodules. (DynamicNet holds MyLinear, not
# nn.Linear, so nothing changes there; a network of nn.Linear layers shows the effect.)
dynamic_net.apply(init_weights)
linear_net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1)).apply(init_weights)
print("after init_weights, biases:", linear_net[0].bias, linear_net[2].bias)

# ---------------------------------------------------------------------------------------------------------------
section("Training with an optimizer")
# Create the network (from previous section) and optimizer
net = Net()
optimizer = torch.optim.SGD(net.parameters(), lr=1e-4, weight_decay=1e-2, momentum=0.9)
print("l1.weight before:", net.l1.weight)

# Run a sample training loop that "teaches" the network
# to output the constant zero function
losses = []
for _ in range(10000):
    input = torch.randn(4)
    output = net(input)
    loss = torch.abs(output)
    net.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())

# After training, switch the module to eval mode to do inference, compute performance metrics, etc.
net.eval()
print(f"mean |output|: first 1000 steps {sum(losses[:1000]) / 1000:.4f}, "
      f"last 1000 steps {sum(losses[-1000:]) / 1000:.4f}")
print("l1.weight after:", net.l1.weight)

# ---------------------------------------------------------------------------------------------------------------
section("Training and evaluation modes")

m = ModalModule()
x = torch.randn(4)

print('training mode output: {}'.format(m(x)))

m.eval()
print('evaluation mode output: {}'.format(m(x)))

# ---------------------------------------------------------------------------------------------------------------
section("Module state: state_dict, buffers, save and load")
workdir = tempfile.TemporaryDirectory()

# Save the module
torch.save(net.state_dict(), os.path.join(workdir.name, 'net.pt'))

# Load the module later on
new_net = Net()
print(new_net.load_state_dict(torch.load(os.path.join(workdir.name, 'net.pt'))))

m = RunningMean(4)
for _ in range(10):
    input = torch.randn(4)
    m(input)

print(m.state_dict())

# Serialized form will contain the 'mean' tensor
torch.save(m.state_dict(), os.path.join(workdir.name, 'mean.pt'))

m_loaded = RunningMean(4)
m_loaded.load_state_dict(torch.load(os.path.join(workdir.name, 'mean.pt')))
assert(torch.all(m.mean == m_loaded.mean))
print("loaded mean matches:", bool(torch.all(m.mean == m_loaded.mean)))

# Moves all module parameters and buffers to the specified device / dtype
m.to(device='cpu', dtype=torch.float64)
for buffer in m.named_buffers():
    print(buffer)

# ---------------------------------------------------------------------------------------------------------------
section("Every kind of state")

m = StatefulModule()

# Save and load state_dict.
torch.save(m.state_dict(), os.path.join(workdir.name, 'state.pt'))
m_loaded = StatefulModule()
m_loaded.load_state_dict(torch.load(os.path.join(workdir.name, 'state.pt')))

# Note that non-persistent buffer "buffer2" and reserved attributes "param3" and "buffer3" do
# not appear in the state_dict.
print(m_loaded.state_dict())
workdir.cleanup()

# ---------------------------------------------------------------------------------------------------------------
section("Forward and backward hooks")
torch.manual_seed(1)

# Create sample module & input.
m = nn.Linear(3, 3)
x = torch.randn(2, 3, requires_grad=True)

hooks_demo(m, x)
