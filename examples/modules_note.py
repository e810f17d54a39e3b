"""The PyTorch Modules note's example code, as the note writes it, with `import runtime as torch`.

One copy, shared by examples/modules_tour.py (which runs the note's walkthrough), tests/test_modules_note.py
(which checks the note's outputs) and tests/test_trace.py (which traces the same modules).
"""
import runtime as torch
import runtime.nn.functional as F
from runtime import nn


class MyLinear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features))
        self.bias = nn.Parameter(torch.randn(out_features))

    def forward(self, input):
        return (input @ self.weight) + self.bias


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


class BigNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = MyLinear(5, 4)
        self.net = Net()

    def forward(self, x):
        return self.net(self.l1(x))


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


class ModalModule(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if self.training:
            # Add a constant only in training mode.
            return x + 1.
        else:
            return x


class RunningMean(nn.Module):
    def __init__(self, num_features, momentum=0.9):
        super().__init__()
        self.momentum = momentum
        self.register_buffer('mean', torch.zeros(num_features))

    def forward(self, x):
        self.mean = self.momentum * self.mean + (1.0 - self.momentum) * x
        return self.mean


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


# Define a function to initialize Linear weights.
# Note that no_grad() is used here to avoid tracking this computation in the autograd graph.
@torch.no_grad()
def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.xavier_normal_(m.weight)
        m.bias.fill_(0.0)


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


def hooks_demo(m, x):
    """The note's hook walkthrough after `m` and `x` are made, verbatim."""
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
