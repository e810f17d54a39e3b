"""What the hook-based weight_norm and spectral_norm share: undoing the forward pre-hook that recomputes a weight."""
from __future__ import annotations


def remove_named_pre_hook(module, kind: type, name: str, what: str) -> None:
    """Undo module's forward pre-hook of type `kind` for parameter `name` (its remove(module)) and drop it; torch's
    ValueError, naming `what`, when there is none."""
    for key, hook in module._forward_pre_hooks.items():
        if isinstance(hook, kind) and hook.name == name:
            hook.remove(module)
            del module._forward_pre_hooks[key]
            return
    raise ValueError(f"{what} of '{name}' not found in {module}")
