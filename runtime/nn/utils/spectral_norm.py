"""torch.nn.utils.spectral_norm, the hook-based form GAN discriminators use: the weight is divided by its largest
singular value, estimated by power iteration. The parameter becomes `<name>_orig`, the iteration's vectors buffers
`<name>_u` and `<name>_v` (updated in place at each forward in training mode, kept in eval mode), and a forward
pre-hook recomputes the weight; state dict keys and version metadata are torch's, so its checkpoints load.
parametrizations.spectral_norm is the newer form of the same."""
from __future__ import annotations

from ... import api
from ...autograd import grad_mode
from .. import functional as F
from ..parameter import Parameter
from ._norm_hooks import remove_named_pre_hook

__all__ = ["SpectralNorm", "spectral_norm", "remove_spectral_norm"]


class SpectralNorm:
    """The forward pre-hook: module.<name> = <name>_orig / sigma, sigma = u . (W v) with W the weight as a matrix
    whose rows run along `dim`."""

    _version = 1  # state dicts since torch 1.0 hold <name>_v; older ones are converted on load

    def __init__(self, name: str = "weight", n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12):
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.name, self.dim, self.n_power_iterations, self.eps = name, dim, n_power_iterations, eps

    def reshape_weight_to_matrix(self, weight):
        if self.dim != 0:
            weight = weight.permute(self.dim, *[d for d in range(weight.dim()) if d != self.dim])
        return weight.reshape(weight.size(0), -1)

    def compute_weight(self, module, do_power_iteration: bool):
        weight = getattr(module, self.name + "_orig")
        u, v = getattr(module, self.name + "_u"), getattr(module, self.name + "_v")
        matrix = self.reshape_weight_to_matrix(weight)
        if do_power_iteration:
            with grad_mode.no_grad():
                for _ in range(self.n_power_iterations):  # the buffers are updated in place, as torch's are
                    v = F.normalize(api.mv(matrix.t(), u), dim=0, eps=self.eps, out=v)
                    u = F.normalize(api.mv(matrix, v), dim=0, eps=self.eps, out=u)
                u, v = u.clone(), v.clone()  # the next forward's update must not change what this one saved
        sigma = api.dot(u, api.mv(matrix, v))
        return weight / sigma

    def remove(self, module) -> None:
        with grad_mode.no_grad():
            weight = self.compute_weight(module, do_power_iteration=False)
        for suffix in ("", "_u", "_v", "_orig"):
            delattr(module, self.name + suffix)
        module.register_parameter(self.name, Parameter(weight.detach()))

    def __call__(self, module, inputs) -> None:
        setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))

    def _solve_v_and_rescale(self, matrix, u, target_sigma):
        """A v with u . (W v) == target_sigma (for a state dict saved before v was kept)."""
        from ... import linalg

        v = linalg.multi_dot([linalg.pinv(matrix.t().mm(matrix)), matrix.t(), u.unsqueeze(1)]).squeeze(1)
        return v.mul_(target_sigma / api.dot(u, api.mv(matrix, v)))

    @staticmethod
    def apply(module, name: str, n_power_iterations: int, dim: int, eps: float) -> "SpectralNorm":
        for hook in module._forward_pre_hooks.values():
            if isinstance(hook, SpectralNorm) and hook.name == name:
                raise RuntimeError(f"Cannot register two spectral_norm hooks on the same parameter {name}")
        fn = SpectralNorm(name, n_power_iterations, dim, eps)
        weight = module._parameters.get(name)
        if weight is None:
            raise ValueError(f"`SpectralNorm` cannot be applied as parameter `{name}` is None")
        with grad_mode.no_grad():
            height, width = fn.reshape_weight_to_matrix(weight).size()
            u = F.normalize(weight.new_empty(height).normal_(0, 1), dim=0, eps=fn.eps)
            v = F.normalize(weight.new_empty(width).normal_(0, 1), dim=0, eps=fn.eps)
        delattr(module, fn.name)
        module.register_parameter(fn.name + "_orig", weight)
        setattr(module, fn.name, weight.detach())
        module.register_buffer(fn.name + "_u", u)
        module.register_buffer(fn.name + "_v", v)
        module.register_forward_pre_hook(fn)
        module.register_state_dict_post_hook(_StateDictHook(fn))
        module.register_load_state_dict_pre_hook(_LoadStateDictPreHook(fn))
        return fn


class _StateDictHook:
    """Records the hook's version in the state dict's metadata (metadata["spectral_norm"]["weight.version"])."""

    def __init__(self, fn: SpectralNorm):
        self.fn = fn

    def __call__(self, module, state_dict, prefix, local_metadata) -> None:
        versions = local_metadata.setdefault("spectral_norm", {})
        key = self.fn.name + ".version"
        if key in versions:
            raise RuntimeError(f"Unexpected key in metadata['spectral_norm']: {key}")
        versions[key] = self.fn._version


class _LoadStateDictPreHook:
    """Converts a state dict saved before version 1 (it held <name> and no <name>_v): v solved from the saved
    weight's ratio to <name>_orig."""

    def __init__(self, fn: SpectralNorm):
        self.fn = fn

    def __call__(self, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                 error_msgs) -> None:
        fn = self.fn
        version = local_metadata.get("spectral_norm", {}).get(fn.name + ".version", None)
        if version is not None and version >= 1:
            return
        key = prefix + fn.name
        if version is None and all(key + s in state_dict for s in ("_orig", "_u", "_v")) and key not in state_dict:
            return  # saved without metadata, but already in this form
        missing = [key + s for s in ("_orig", "", "_u") if key + s not in state_dict]
        if missing:
            if strict:
                missing_keys.extend(missing)
            return
        with grad_mode.no_grad():
            weight_orig, weight = state_dict[key + "_orig"], state_dict.pop(key)
            sigma = (weight_orig / weight).mean()
            state_dict[key + "_v"] = fn._solve_v_and_rescale(fn.reshape_weight_to_matrix(weight_orig),
                                                             state_dict[key + "_u"], sigma)


def spectral_norm(module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None):
    """Divide module.<name> by its spectral norm before every forward (dim: the weight's output dimension, 1 for
    transposed convolutions, else 0)."""
    if dim is None:
        from .. import ConvTranspose1d, ConvTranspose2d, ConvTranspose3d  # NOTE: here: nn.modules imports nn.utils

        dim = 1 if isinstance(module, (ConvTranspose1d, ConvTranspose2d, ConvTranspose3d)) else 0
    SpectralNorm.apply(module, name, n_power_iterations, dim, eps)
    return module


def remove_spectral_norm(module, name: str = "weight"):
    """Put module.<name> back as one parameter holding <name>_orig / sigma, and drop the hooks."""
    remove_named_pre_hook(module, SpectralNorm, name, "spectral_norm")
    for hooks, kind in ((module._state_dict_hooks, _StateDictHook),
                        (module._load_state_dict_pre_hooks, _LoadStateDictPreHook)):
        for key, hook in list(hooks.items()):
            if isinstance(hook, kind) and hook.fn.name == name:
                del hooks[key]
                break
    return module
