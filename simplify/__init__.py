"""isl-backed simplification of te_grad iteration domains.

- :func:`simplify`: exact, cheaper equivalents of tensors (gathers with tight
  loops, real scatters for data-dependent indices and for sums whose ``where``
  pins an output index by data, ``dst[e] == i``, reduce axes pinned by data
  solved away, merged contributions, element-wise chains fused);
- :func:`iterations`: exact innermost-iteration counts;
- :func:`check_bounds`: static proofs that reads stay in bounds.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Set, Union

from te_grad.collector import during_build
from te_grad.ir import Tensor
from te_grad.verify import verify_if_enabled

from .bounds import RuntimeCheck, check_bounds
from .count import iterations
from .inline import inline_elementwise
from .rewrite import simplify_graph

__all__ = ["simplify", "simplify_graph", "iterations", "check_bounds", "RuntimeCheck"]


@during_build
def simplify(tensors: Union[Tensor, Iterable[Tensor]], keep: Set[int] = frozenset(),
             runtime: Optional[List[RuntimeCheck]] = None):
    """Simplified equivalents of ``tensors`` (same structure: a tensor or a list).

    Every read of the graph is first proven in bounds (a UserError otherwise). Element-wise
    chains behind ``tensors`` are then fused (:mod:`.inline`): what a kernel computes.
    The reads that cannot be decided statically (:func:`check_bounds`) are appended to
    ``runtime`` when it is given: a backend must check them where they run (``tg.build``
    does, see :mod:`codegen.llvm_emit`). A tensor read by such a read is kept as it is and
    never fused into its reader: the read stays a read of a buffer, so the check stays
    where it runs (a fused or folded producer would be computed at the index, out of
    bounds or not, where the evaluator refuses the read).
    """
    single = isinstance(tensors, Tensor)
    ts: List[Tensor] = [tensors] if single else list(tensors)
    undecided = check_bounds(ts)
    if runtime is not None:
        runtime.extend(undecided)
    protected = set(keep) | {id(c.read.tensor) for c in undecided}
    new = simplify_graph(ts, protected)
    out = [new[id(t)] for t in ts]
    fused = inline_elementwise(out, {id(new[k]) for k in protected if k in new})
    out = [fused[id(t)] for t in out]
    verify_if_enabled(out, "simplify")
    return out[0] if single else out
