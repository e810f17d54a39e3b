"""Containers: Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict."""
from __future__ import annotations

import operator
from collections import OrderedDict

from ...tensor import Tensor
from ..parameter import Parameter
from .module import Module


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")


def _index(idx: int, size: int) -> int:
    idx = operator.index(idx)
    if not -size <= idx < size:
        raise IndexError(f"index {idx} is out of range")
    return idx + size if idx < 0 else idx


class Sequential(Module):
    """Modules called in order, each on the previous one's output."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__(OrderedDict(list(self._modules.items())[idx]))
        return list(self._modules.values())[_index(idx, len(self))]

    def __setitem__(self, idx, module) -> None:
        key = list(self._modules.keys())[_index(idx, len(self))]
        setattr(self, key, module)

    def __delitem__(self, idx) -> None:
        keys = list(self._modules.keys())
        for key in (keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self))]]):
            delattr(self, key)
        items = list(self._modules.items())
        self._modules.clear()
        self._modules.update((str(i), m) for i, (_, m) in enumerate(items))

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __add__(self, other: "Sequential") -> "Sequential":
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but {type(other)} is given.")
        return Sequential(*self, *other)

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), module)
        return self

    def insert(self, index: int, module: Module) -> "Sequential":
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        n = len(self)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        index = index + n if index < 0 else index
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        self._modules.update((str(i), m) for i, m in enumerate(modules))
        return self

    def extend(self, sequential) -> "Sequential":
        for module in sequential:
            self.append(module)
        return self

    def pop(self, key: int) -> Module:
        module = self[key]
        del self[key]
        return module

    def forward(self, input):
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    """A list of submodules, registered so they appear in parameters(), state_dict() and repr."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__(list(self._modules.values())[idx])
        return self._modules[str(_index(idx, len(self)))]

    def __setitem__(self, idx, module) -> None:
        setattr(self, str(_index(idx, len(self))), module)

    def __delitem__(self, idx) -> None:
        keys = list(self._modules.keys())
        for key in (keys[idx] if isinstance(idx, slice) else [keys[_index(idx, len(self))]]):
            del self._modules[key]
        modules = list(self._modules.values())
        self._modules.clear()
        self._modules.update((str(i), m) for i, m in enumerate(modules))

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules) -> "ModuleList":
        return self.extend(modules)

    def __add__(self, other) -> "ModuleList":
        return ModuleList([*self, *other])

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(modules):
            self.add_module(str(i), m)

    def pop(self, key: int) -> Module:
        module = self[key]
        del self[key]
        return module

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward(); iterate over it in your module's forward")

    def __repr__(self) -> str:
        """Like torch: runs of identical children print once, as `(0-2): 3 x ReLU()`."""
        entries = [(int(key), repr(module)) for key, module in self._modules.items()]
        if not entries:
            return self._get_name() + "()"
        lines, start = [], 0
        for i in range(1, len(entries) + 1):
            if i == len(entries) or entries[i][1] != entries[start][1]:
                first, last, text = entries[start][0], entries[i - 1][0], entries[start][1]
                label = f"({first})" if first == last else f"({first}-{last}): {last - first + 1} x"
                lines.append(f"{label}: {_indent(text)}" if first == last else f"{label} {_indent(text)}")
                start = i
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"


class ModuleDict(Module):
    """A dict of submodules (ordered by insertion), registered like attributes."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules) -> None:
        pairs = modules.items() if hasattr(modules, "items") else modules
        for entry in pairs:
            key, module = entry
            self[key] = module

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward(); index it in your module's forward")


def _as_parameter(value):
    if isinstance(value, Tensor) and not isinstance(value, Parameter):
        return Parameter(value)
    return value


class ParameterList(Module):
    """A list of parameters; plain tensors are wrapped as Parameters."""

    def __init__(self, values=None):
        super().__init__()
        self._size = 0
        if values is not None:
            self.extend(values)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__([self[i] for i in range(len(self))[idx]])
        return getattr(self, str(_index(idx, len(self))))

    def __setitem__(self, idx, param) -> None:
        setattr(self, str(_index(idx, len(self))), _as_parameter(param))

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __iadd__(self, parameters) -> "ParameterList":
        return self.extend(parameters)

    def append(self, value) -> "ParameterList":
        self._size += 1
        setattr(self, str(self._size - 1), _as_parameter(value))
        return self

    def extend(self, values) -> "ParameterList":
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        lines = []
        for i, p in enumerate(self):
            lines.append(f"  ({i}): {_param_line(p, str(p.dtype) if isinstance(p, Tensor) else '')}")
        return "\n".join(lines)


class ParameterDict(Module):
    """A dict of parameters (ordered by insertion); plain tensors are wrapped as Parameters."""

    def __init__(self, parameters=None):
        super().__init__()
        self._keys: dict = {}
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str):
        return getattr(self, key)

    def __setitem__(self, key: str, value) -> None:
        self._keys[key] = None
        setattr(self, key, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def keys(self):
        return self._keys.keys()

    def items(self):
        return ((k, self[k]) for k in self._keys)

    def values(self):
        return (self[k] for k in self._keys)

    def pop(self, key: str):
        value = self[key]
        del self[key]
        return value

    def clear(self) -> None:
        for key in list(self._keys):
            del self[key]

    def update(self, parameters) -> None:
        """Plain dicts are added in sorted key order, ordered ones in their own order (as torch does)."""
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs = parameters.items()
        elif hasattr(parameters, "items"):
            pairs = sorted(parameters.items())
        else:
            pairs = parameters
        for key, value in pairs:
            self[key] = value

    def extra_repr(self) -> str:
        lines = []
        for key, p in self.items():
            lines.append(f"  ({key}): {_param_line(p, p.type() if isinstance(p, Tensor) else '')}")
        return "\n".join(lines)


def _param_line(p, type_name: str) -> str:
    """One entry of ParameterList's and ParameterDict's reprs, as torch's: each line is indented two spaces more
    than the module's own (so four in all), and ParameterDict names a tensor's legacy type (`torch.FloatTensor`)
    where ParameterList names its dtype."""
    if not isinstance(p, Tensor):
        return f"Object of type: {type(p).__name__}"
    from ..parameter import Parameter

    kind = "Parameter" if isinstance(p, Parameter) else "Tensor"
    return f"{kind} containing: [{type_name} of size {'x'.join(str(s) for s in p.shape)}]"
