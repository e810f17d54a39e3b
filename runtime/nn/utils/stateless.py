"""torch.nn.utils.stateless: functional_call's first home, deprecated in favour of torch.func.functional_call."""
from __future__ import annotations

import warnings


def functional_call(module, parameters_and_buffers, args=None, kwargs=None, *, tie_weights: bool = True,
                    strict: bool = False):
    """torch.func.functional_call, with torch's deprecation warning."""
    from ...func import functional_call as call

    warnings.warn("This API is deprecated as of PyTorch 2.0 and will be removed in a future version of PyTorch. "
                  "Please use torch.func.functional_call instead which is a drop-in replacement.", FutureWarning,
                  stacklevel=2)
    return call(module, parameters_and_buffers, args, kwargs, tie_weights=tie_weights, strict=strict)
