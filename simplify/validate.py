"""Translation validation: a scan is returned only after isl proves it visits exactly its domain.

:func:`scan` turns isl's AST into te_grad loop nests (:meth:`~simplify.isl_bridge.Domain.scan_in`).
Both steps can go wrong: isl's AST generator itself drops points for some
domains with several modular constraints (``{(i, j) : (i + j) mod 3 = p0,
(j + 1) mod 5 = p1}`` comes back as a single statement although two ``i``
reach some ``(p0, p1)``), and the translation back to te_grad expressions is
code of ours. So the result is checked in the other direction, from the te_grad
expressions back to isl, which decides Presburger arithmetic exactly:

- each nest, written as ``{[p] -> [loops, dims] : guards, loop bounds, filters,
  dims = values(p, loops)}``, projected onto the dimensions, and all nests
  together, equal the domain: the same points;
- within a nest the map from loop variables to dimensions is injective, and
  no two nests share a point: each point once.

:func:`check_nests` returns None when both hold and says what fails otherwise;
an expression isl cannot represent makes the check undecidable, which is a
failure too.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from te_grad.errors import InternalError

from .affine import isl_cond, isl_expr
from .isl_bridge import IslError, LoopNest, Unsupported, Unverified, empty_set, parse_map


def _nest_text(domain, nest, k: int):
    """The map ``loops -> dims`` of nest ``k`` in isl syntax, or a reason it has none."""
    names: Dict[int, str] = domain.param_names()
    loops = []
    cons: List[str] = []
    for g in nest.guards:
        text = isl_cond(g, names)
        if text is None:
            return None, f"guard {g} is not quasi-affine"
        cons.append(text)
    for n, ax in enumerate(nest.axes):
        lo, hi = isl_expr(ax.lo, names), isl_expr(ax.hi, names)
        if lo is None or hi is None:
            return None, f"the bounds of loop {ax.name} ({ax.lo}, {ax.hi}) are not quasi-affine"
        name = f"l{k}_{n}"
        names[id(ax)] = name
        loops.append(name)
        cons.append(f"{lo} <= {name} < {hi}")
    for f in nest.filters:
        text = isl_cond(f, names)
        if text is None:
            return None, f"filter {f} is not quasi-affine"
        cons.append(text)
    if len(nest.values) != len(domain.dims):
        return None, f"a nest gives {len(nest.values)} values for {len(domain.dims)} dimensions"
    dims = [d[0] for d in domain.dims]
    for d, v in zip(dims, nest.values):
        text = isl_expr(v, names)
        if text is None:
            return None, f"the value {v} of {d} is not quasi-affine"
        cons.append(f"{d} = {text}")
    body = " and ".join(cons) if cons else "0 = 0"
    lnames = ", ".join(loops)
    dnames = ", ".join(dims)
    return f"{domain.header()} -> {{ L[{lnames}] -> S[{dnames}] : {body} }}", None


def scan(domain) -> List[LoopNest]:
    """Loop nests that together visit every point of ``domain`` exactly once.

    Each scan is checked by :func:`check_nests` before it is returned; a scan that fails
    (isl's AST generator loses points of some domains with several modular constraints)
    is retried with the dimensions in other orders, and
    :class:`~simplify.isl_bridge.Unverified` is raised when none passes."""
    if domain.set.is_empty():
        return []
    reasons: List[str] = []
    for order, option in domain.schedules():
        try:
            nests = domain.scan_in(order, option)
        except Unsupported as err:
            reasons.append(str(err))
            continue
        why = check_nests(domain, nests)
        if why is None:
            return nests
        reasons.append(f"the scan in order {order}{' (' + option + ')' if option else ''}: {why}")
    raise Unverified("; ".join(dict.fromkeys(reasons)))


def check_nests(domain, nests) -> Optional[str]:
    """None if ``nests`` visit exactly the points of ``domain``, each once; else the reason."""
    images = []
    try:
        for k, nest in enumerate(nests):
            text, why = _nest_text(domain, nest, k)
            if text is None:
                return f"cannot be decided: {why}"
            relation = parse_map(text).intersect_params(domain.context)
            if not relation.is_injective():
                return f"nest {k} visits some point more than once"
            image = relation.range()
            for j, other in enumerate(images):
                if not image.is_disjoint(other):
                    return f"nests {j} and {k} both visit some point"
            images.append(image)
        covered = images[0] if images else empty_set(domain.set.get_space())
        for image in images[1:]:
            covered = covered.union(image)
        if not covered.is_equal(domain.set):
            missing = domain.set.subtract(covered)
            if not missing.is_empty():
                return f"the loops miss points of the domain, e.g. {_point(missing)}"
            return f"the loops visit points outside the domain, e.g. {_point(covered.subtract(domain.set))}"
    except IslError as err:
        raise InternalError(f"isl failed while validating a scan: {err}") from None
    return None


def _point(s) -> str:
    try:
        return str(s.sample_point())
    except IslError:
        return str(s)
