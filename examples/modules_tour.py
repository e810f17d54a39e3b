"""A tour of PyTorch's "Modules" note, its code run unchanged with `import runtime as torch`."""
import os
import tempfile

import runtime as torch
from runtime import nn
import runtime.nn.functional as F

torch.manual_seed(0)


def section(title):
    print(f"\n=== {title} ===")


# ---------------------------------------------------------------------------------------------------------------
section("A simple custom module")
# A module subclasses nn.Module, registers state (Parameters) and defines forward().


class MyLinear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features))
        self.bias = nn.Parameter(torch.randn(out_features))

    def forward(self, input):
        return (input @ self.weight) + self.bias


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


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = MyLinear(4, 3)
        self.l1 = MyLinear(3, 1)

    def forward(self, x):
        x = self.l0(x)
        x = F.relu(x)
        x = self.l1(x)
        return x


net = Net()
for child in net.named_children():      # immediate children only
    print(child)


class BigNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = MyLinear(5, 4)
        self.net = Net()

    def forward(self, x):
        return self.net(self.l1(x))


big_net = BigNet()
for module in big_net.named_modules():  # recursive, the module itself first
    print(module)

# ---------------------------------------------------------------------------------------------------------------
section("Dynamic submodules: ModuleList and ModuleDict")


class DynamicNet(nn.Module):
    def __init__(self, num_layers):
        super().__init__()
        self.linears = nn.ModuleList(
            [MyLinear(4, 4) for _ in range(num_layers)])
        self.activations = nn.ModuleDict({
            'relu': nn.ReLU(),
            'lrelu': nn.LeakyReLU()
        })
        self.final = MyLinear(4, 1)

    def forward(self, x, act):
        for linear in self.linears:
            x = linear(x)
        x = self.activations[act](x)
        x = self.final(x)
        return x


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


# Define a function to initialize Linear weights.
# Note that no_grad() is used here to avoid tracking this computation in the autograd graph.
@torch.no_grad()
def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.xavier_normal_(m.weight)
        m.bias.fill_(0.0)


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


class ModalModule(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if self.training:
            # Add a constant only in training mode.
            return x + 1.
        else:
            return x


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


class RunningMean(nn.Module):
    def __init__(self, num_features, momentum=0.9):
        super().__init__()
        self.momentum = momentum
        self.register_buffer('mean', torch.zeros(num_features))

    def forward(self, x):
        self.mean = self.momentum * self.mean + (1.0 - self.momentum) * x
        return self.mean


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


class StatefulModule(nn.Module):
    def __init__(self):
        super().__init__()
        # Setting a nn.Parameter as an attribute of the module automatically registers the tensor
        # as a parameter of the module.
        self.param1 = nn.Parameter(torch.randn(2))

        # Alternative string-based way to register a parameter.
        self.register_parameter('param2', nn.Parameter(torch.randn(3)))

        # Reserves the "param3" attribute as a parameter, preventing it from being set to anything
        # except a parameter. "None" entries like this will not be present in the module's state_dict.
        self.register_parameter('param3', None)

        # Registers a list of parameters.
        self.param_list = nn.ParameterList([nn.Parameter(torch.randn(2)) for i in range(3)])

        # Registers a dictionary of parameters.
        self.param_dict = nn.ParameterDict({
            'foo': nn.Parameter(torch.randn(3)),
            'bar': nn.Parameter(torch.randn(4))
        })

        # Registers a persistent buffer (one that appears in the module's state_dict).
        self.register_buffer('buffer1', torch.randn(4), persistent=True)

        # Registers a non-persistent buffer (one that does not appear in the module's state_dict).
        self.register_buffer('buffer2', torch.randn(5), persistent=False)

        # Reserves the "buffer3" attribute as a buffer, preventing it from being set to anything
        # except a buffer. "None" entries like this will not be present in the module's state_dict.
        self.register_buffer('buffer3', None)

        # Adding a submodule registers its parameters as parameters of the module.
        self.linear = nn.Linear(2, 3)


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


def forward_pre_hook(m, inputs):
    # Allows for examination and modification of the input before the forward pass.
    # Note that inputs are always wrapped in a tuple.
    input = inputs[0]
    return input + 1.


def forward_hook(m, inputs, output):
    # Allows for examination of inputs / outputs and modification of the outputs
    # after the forward pass. Note that inputs are always wrapped in a tuple while outputs
    # are passed as-is.

    # Residual computation a la ResNet.
    return output + inputs[0]


def backward_hook(m, grad_inputs, grad_outputs):
    # Allows for examination of grad_inputs / grad_outputs and modification of
    # grad_inputs used in the rest of the backwards pass. Note that grad_inputs and
    # grad_outputs are always wrapped in tuples.
    new_grad_inputs = [torch.ones_like(gi) * 42. for gi in grad_inputs]
    return new_grad_inputs


# Create sample module & input.
m = nn.Linear(3, 3)
x = torch.randn(2, 3, requires_grad=True)

# ==== Demonstrate forward hooks. ====
# Run input through module before and after adding hooks.
print('output with no forward hooks: {}'.format(m(x)))

# Note that the modified input results in a different output.
forward_pre_hook_handle = m.register_forward_pre_hook(forward_pre_hook)
print('output with forward pre hook: {}'.format(m(x)))

# Note the modified output.
forward_hook_handle = m.register_forward_hook(forward_hook)
print('output with both forward hooks: {}'.format(m(x)))

# Remove hooks; note that the output here matches the output before adding hooks.
forward_pre_hook_handle.remove()
forward_hook_handle.remove()
print('output after removing forward hooks: {}'.format(m(x)))

# ==== Demonstrate backward hooks. ====
m(x).sum().backward()
print('x.grad with no backwards hook: {}'.format(x.grad))

# Clear gradients before running backward pass again.
m.zero_grad()
x.grad.zero_()

m.register_full_backward_hook(backward_hook)
m(x).sum().backward()
print('x.grad with backwards hook: {}'.format(x.grad))
