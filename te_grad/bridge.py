"""What the framework bridges (``te_grad.torch``, ``te_grad.jax``) share, free of any framework."""
from __future__ import annotations

import inspect
from typing import Callable, Dict, List, Tuple

from .errors import UserError


def tensor_params(fn: Callable) -> Tuple[List[str], Dict[str, object]]:
    """``fn``'s tensor parameters (positional, without a default) and its attributes (with one)."""
    params = list(inspect.signature(fn).parameters.values())
    tensors = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is inspect.Parameter.empty]
    attrs = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    if not tensors:
        raise UserError(f"{getattr(fn, '__name__', fn)} takes no tensor arguments (parameters without a "
                        "default value)")
    return tensors, attrs
