"""What the framework bridges (``te_grad.torch``, ``te_grad.jax``) share, free of any framework."""
from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
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


#: input shapes (and dtypes) an op of a bridge keeps built at once, by default
MAX_SHAPES = 64


def check_max_shapes(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"max_shapes must be a positive int (how many input shapes an op keeps built), "
                        f"got {value!r}")
    return value


class ShapeBounded:
    """The ``max_shapes`` knob of a framework op (kept in its :class:`SpecCache`)."""
    _specs: "SpecCache"

    @property
    def max_shapes(self) -> int:
        """How many combinations of input shapes and dtypes the op keeps built."""
        return self._specs.size

    @max_shapes.setter
    def max_shapes(self, value: int):
        self._specs.size = value


class SpecCache:
    """An op's graphs and kernels by input shapes and dtypes: at most ``size`` of them, the
    least recently used dropped first (with its kernels, whose engines are freed once the
    JIT's own bounded cache lets go of them too), so a long run over ever new shapes stays
    flat in memory. ``on_evict(spec)`` is told of each one dropped. Thread-safe."""

    def __init__(self, size: int = MAX_SHAPES, on_evict: Callable = None):
        self._size = check_max_shapes(size)
        self._on_evict = on_evict
        self._specs: "OrderedDict[tuple, object]" = OrderedDict()
        self.lock = threading.RLock()

    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, value: int):
        with self.lock:
            self._size = check_max_shapes(value)
            self._trim()

    def get(self, key, make: Callable):
        """The spec of ``key``, made by ``make()`` if it is not kept."""
        with self.lock:
            spec = self._specs.get(key)
            if spec is not None:
                self._specs.move_to_end(key)
                return spec
            spec = self._specs[key] = make()
            self._trim()
            return spec

    def _trim(self):
        while len(self._specs) > self._size:
            _, spec = self._specs.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(spec)

    def __len__(self):
        return len(self._specs)

    def __contains__(self, key):
        return key in self._specs

    def keys(self):
        with self.lock:
            return list(self._specs)
