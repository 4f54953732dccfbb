"""The one module that talks to isl.

A :class:`Domain` is an integer set over *parameters* (the output indices of
a tensor, fixed while one element is computed) and *dimensions* (the loop
variables of a reduction), given by quasi-affine constraints in isl syntax
(see :mod:`.affine`). :func:`simplify.validate.scan` asks isl's AST generator for a loop
nest that visits exactly its points and converts that AST back to te_grad IR:
isl eliminates every dimension an equality determines, turns congruences into
strided loops, and gives tight (min/max/floordiv) bounds for the rest.

Size variables (:class:`te_grad.ir.SizeVar`) are parameters too, constrained by their
ranges (``lo <= n``, ``n <= hi``): a set, a proof or a count then holds for every size,
and the loop nests isl builds use the size variables themselves (an output extent may be
a size expression, ``0 <= p0 < n - 1``). Without size variables the isl texts are those
of fixed shapes, unchanged.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import islpy as isl

from te_grad import dsl
from te_grad.errors import InternalError
from te_grad.ir import Expr, ReduceAxis, SizeVar, Var
from te_grad.sizes import size_vars_in

from .affine import IslNames, isl_expr, size_param


#: isl's error, raised by the methods of the sets and maps this module hands out
IslError = isl.Error


def parse_map(text: str):
    """The isl map written as ``text`` (isl syntax)."""
    return isl.Map(text)


def empty_set(space):
    """The empty isl set in ``space``."""
    return isl.Set.empty(space)


class Unsupported(Exception):
    """isl produced a loop form this bridge does not translate (callers fall back)."""


class Unverified(Unsupported):
    """No scan of the domain passed translation validation (:mod:`.validate`); the message
    says why. Callers fall back to a form that is correct by construction."""


#: the most schedules (orders of the dimensions) tried before a domain is given up
MAX_ORDERS = 24


@dataclass
class LoopNest:
    """One piece of a scanned domain.

    ``guards`` hold on the parameters only; ``axes`` are the loops (outer
    first, bounds may use parameters and outer axes); ``filters`` are extra
    conditions inside the loops; ``values[d]`` is dimension ``d`` at each point.
    """
    guards: List[Expr] = field(default_factory=list)
    axes: List[ReduceAxis] = field(default_factory=list)
    filters: List[Expr] = field(default_factory=list)
    values: List[Expr] = field(default_factory=list)
    strided: int = 0  # how many of the loops step by more than one


#: parsed domains kept for reuse (the bounds checks and the simplifier build the same ones
#: many times over; isl sets are immutable values, so sharing them is safe)
PARSED_DOMAINS = 4096


@functools.lru_cache(maxsize=PARSED_DOMAINS)
def _parsed(context_text: str, set_text: str):
    """``(context, set)`` parsed from their isl texts, the set restricted to the context."""
    context = isl.Set(context_text)
    return context, isl.Set(set_text).intersect_params(context)


@functools.lru_cache(maxsize=PARSED_DOMAINS)
def _sample(context_text: str, set_text: str) -> Optional[Tuple[Tuple[str, int], ...]]:
    """One point of the parsed set, its parameters then its dimensions, or None if empty."""
    domain = _parsed(context_text, set_text)[1]
    if domain.is_empty():
        return None
    n_params = domain.dim(isl.dim_type.param)
    flat = domain.move_dims(isl.dim_type.set, 0, isl.dim_type.param, 0, n_params)
    point = flat.sample_point()
    names = [domain.get_dim_name(isl.dim_type.param, i) for i in range(n_params)] + \
        [domain.get_dim_name(isl.dim_type.set, i) for i in range(domain.dim(isl.dim_type.set))]
    return tuple((n, point.get_coordinate_val(isl.dim_type.set, i).to_python()) for i, n in enumerate(names))


@functools.lru_cache(maxsize=PARSED_DOMAINS)
def implies(params: str, a: str, b: str) -> bool:
    """True if every point of ``params`` (isl: ``[sizes] -> { [dims] : ranges }``) that
    satisfies the condition ``a`` satisfies ``b`` (both quasi-affine, isl syntax over the
    dims and sizes)."""
    head, body = params.split("{", 1)
    space, ranges = body.rsplit(":", 1)
    ranges = ranges.rstrip(" }")
    sa = isl.Set(f"{head}{{{space}: {ranges} and {a} }}")
    sb = isl.Set(f"{head}{{{space}: {ranges} and {b} }}")
    return sa.is_subset(sb)


@functools.lru_cache(maxsize=PARSED_DOMAINS)
def _ast(texts: Tuple[str, str], dnames: str, order: Tuple[int, ...], option: Optional[str]):
    """isl's AST scanning the domain of ``texts`` (dimensions ``dnames``) in ``order``, with
    isl's AST ``option`` (``"atomic"``) or none. Kept per text: the layers of a model repeat
    their domains, and an AST is a value (its readers copy what they take from it)."""
    context, domain = _parsed(*texts)
    names = dnames.split(", ") if dnames else []
    snames = ", ".join(names[k] for k in order)
    sched = isl.UnionMap.from_map(isl.Map(f"{{ S[{dnames}] -> [{snames}] }}").intersect_domain(domain))
    build = isl.AstBuild.from_context(context)
    if option is not None and order:
        slots = ", ".join(f"s{k}" for k in range(len(order)))
        build = build.set_options(isl.UnionMap(f"{{ [{slots}] -> {option}[x] : 0 <= x < {len(order)} }}"))
    try:
        return build.node_from_schedule_map(sched)
    except isl.Error as err:  # e.g. "unknown divs" for some nested floor/min/max bounds
        raise Unsupported(f"isl could not scan the domain: {err}") from None


class Domain:
    """``{ [dims] : constraints }`` with parameters; see the module docstring."""

    def __init__(self, params: Sequence[Tuple[str, Var, object]], dims: Sequence[Tuple[str, str]],
                 constraints: Sequence[str], order: Sequence[int] = None, sizes: Sequence[SizeVar] = ()):
        self.params = list(params)      # (isl name, IR variable, extent: an int or a size expression)
        self.dims = list(dims)          # (isl name, readable hint)
        self.constraints = list(constraints)
        # the schedule: the order in which dimensions become loops (earlier ones are kept as
        # loop variables, later ones are solved from equalities where possible)
        self.order = list(order) if order is not None else list(range(len(self.dims)))
        # size parameters: those the constraints use (``sizes``) and those of the extents
        names = IslNames()
        for v in sizes:
            names.sizes.setdefault(size_param(v), v)
        extents = []
        for p in self.params:
            text = isl_expr(p[2], names) if isinstance(p[2], Expr) else str(p[2])
            if text is None:
                raise InternalError(f"the extent {p[2]} of {p[0]} is not quasi-affine in the sizes")
            extents.append(text)
        for p in self.params:
            for v in size_vars_in(p[2]):
                names.sizes.setdefault(size_param(v), v)
        self.sizes = list(names.sizes.items())   # (isl name, size variable)
        pnames = ", ".join([n for n, _ in self.sizes] + [p[0] for p in self.params])
        dnames = ", ".join(d[0] for d in self.dims)
        body = " and ".join(self.constraints) if self.constraints else "0 = 0"
        ranges = [f"{v.lo} <= {n}" + (f" <= {v.hi}" if v.hi is not None else "") for n, v in self.sizes]
        self._texts = (f"[{pnames}] -> {{ : " + (" and ".join(
            ranges + [f"0 <= {p[0]} < {e}" for p, e in zip(self.params, extents)]) or "0 = 0") + " }",
            f"[{pnames}] -> {{ S[{dnames}] : {body} }}")
        try:
            self.context, self.set = _parsed(*self._texts)
        except isl.Error as err:
            raise InternalError(f"isl rejected the domain {body!r}: {err}") from None

    def param_names(self) -> Dict[int, str]:
        """``{id(IR variable): isl name}`` of every parameter, sizes included."""
        names = IslNames({id(p[1]): p[0] for p in self.params})
        names.update({id(v): n for n, v in self.sizes})
        return names

    def header(self) -> str:
        """The parameter list of the domain's isl texts: ``[sizes, params]``."""
        return "[" + ", ".join([n for n, _ in self.sizes] + [p[0] for p in self.params]) + "]"

    def is_empty(self) -> bool:
        return self.set.is_empty()

    def sample(self) -> Optional[Dict[str, int]]:
        """One point of the domain (parameters and dimensions by isl name), or None if empty."""
        point = _sample(*self._texts)
        return dict(point) if point is not None else None

    def schedules(self):
        """The requested order, its reverse, isl's 'atomic' generation of each, then other
        orders (at most :data:`MAX_ORDERS` schedules in all)."""
        import itertools
        first = [list(self.order), list(reversed(self.order))]
        tried = []
        for option in (None, "atomic"):
            for order in first:
                if (order, option) not in tried:
                    tried.append((order, option))
        for perm in itertools.permutations(self.order):
            if len(tried) >= MAX_ORDERS:
                break
            if (list(perm), None) not in tried:
                tried.append((list(perm), None))
        yield from tried

    def scan_in(self, order, option=None) -> List[LoopNest]:
        """The domain as loop nests in ``order`` (isl's AST, translated to te_grad loops; the
        AST is generated once per domain text, order and option, the translation every time)."""
        self._current_order = order
        root = _ast(self._texts, ", ".join(d[0] for d in self.dims), tuple(order), option)
        env: Dict[str, Expr] = {p[0]: p[1] for p in self.params}
        env.update({n: v for n, v in self.sizes})
        out: List[LoopNest] = []
        self._walk(root, env, LoopNest(), out)
        return out

    # -- AST to IR -----------------------------------------------------------------
    def _walk(self, node, env, nest: LoopNest, out: List[LoopNest]):
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            children = node.block_get_children()
            for i in range(children.n_ast_node()):
                self._walk(children.get_at(i), env, nest, out)
        elif kind == isl.ast_node_type.mark:
            self._walk(node.mark_get_node(), env, nest, out)
        elif kind == isl.ast_node_type.if_:
            cond = _cond(_expr(node.if_get_cond(), env))
            self._walk(node.if_get_then_node(), env, _with_cond(nest, cond), out)
            if node.if_has_else_node():
                self._walk(node.if_get_else_node(), env, _with_cond(nest, ~cond), out)
        elif kind == isl.ast_node_type.for_:
            self._walk_for(node, env, nest, out)
        elif kind == isl.ast_node_type.user:
            call = node.user_get_expr()
            values = [_expr(call.get_op_arg(i + 1), env) for i in range(call.get_op_n_arg() - 1)]
            out.append(LoopNest(list(nest.guards), list(nest.axes), list(nest.filters), values, nest.strided))
        else:
            raise Unsupported(f"isl AST node {kind}")

    def _walk_for(self, node, env, nest: LoopNest, out):
        name = node.for_get_iterator().get_id().get_name()
        init = _expr(node.for_get_init(), env)
        if node.for_is_degenerate():
            self._walk(node.for_get_body(), {**env, name: init}, nest, out)
            return
        stride = node.for_get_inc().get_val().to_python()
        hi = _upper_bound(node.for_get_cond(), name, env)
        hint = self._hint(name)
        if stride == 1:
            axis = ReduceAxis(hint, "int64", init, hi)
            value = axis
        else:
            axis = ReduceAxis(hint, "int64", dsl.const(0), (hi - init + (stride - 1)) // stride)
            value = init + stride * axis
        inner = LoopNest(list(nest.guards), list(nest.axes) + [axis], list(nest.filters),
                         strided=nest.strided + (stride != 1))
        self._walk(node.for_get_body(), {**env, name: value}, inner, out)

    def _hint(self, iterator: str) -> str:
        if iterator.startswith("c") and iterator[1:].isdigit() and int(iterator[1:]) < len(self.dims):
            return self.dims[self._current_order[int(iterator[1:])]][1]
        return iterator


def _with_cond(nest: LoopNest, cond: Expr) -> LoopNest:
    inner = LoopNest(list(nest.guards), list(nest.axes), list(nest.filters), strided=nest.strided)
    (inner.filters if nest.axes else inner.guards).append(cond)
    return inner


def _upper_bound(cond, iterator: str, env) -> Expr:
    """The exclusive upper bound of a loop from its isl condition ``c <= e`` / ``c < e``."""
    if cond.get_type() != isl.ast_expr_type.op:
        raise Unsupported("loop condition is not a comparison")
    op = cond.get_op_type()
    if op in (isl.ast_expr_op_type.and_, isl.ast_expr_op_type.and_then):
        return dsl.minimum(_upper_bound(cond.get_op_arg(0), iterator, env),
                           _upper_bound(cond.get_op_arg(1), iterator, env))
    lhs, rhs = cond.get_op_arg(0), cond.get_op_arg(1)
    is_iter = (lhs.get_type() == isl.ast_expr_type.id and lhs.get_id().get_name() == iterator)
    if not is_iter:
        raise Unsupported(f"loop condition {cond.to_C_str()}")
    bound = _expr(rhs, env)
    if op == isl.ast_expr_op_type.le:
        return bound + 1
    if op == isl.ast_expr_op_type.lt:
        return bound
    raise Unsupported(f"loop condition {cond.to_C_str()}")


def _fold(fn, args):
    out = args[0]
    for a in args[1:]:
        out = fn(out, a)
    return out


def _cond(e: Expr) -> Expr:
    """``e`` as a condition: isl's AST may put an integer (a constant 1) where a truth value goes."""
    return e if e.dtype == "bool" else e != 0


_OPS = {
    isl.ast_expr_op_type.and_: lambda a: _fold(lambda x, y: _cond(x) & _cond(y), a),
    isl.ast_expr_op_type.and_then: lambda a: _fold(lambda x, y: _cond(x) & _cond(y), a),
    isl.ast_expr_op_type.or_: lambda a: _fold(lambda x, y: _cond(x) | _cond(y), a),
    isl.ast_expr_op_type.or_else: lambda a: _fold(lambda x, y: _cond(x) | _cond(y), a),
    isl.ast_expr_op_type.max: lambda a: _fold(dsl.maximum, a),
    isl.ast_expr_op_type.min: lambda a: _fold(dsl.minimum, a),
    isl.ast_expr_op_type.minus: lambda a: -a[0],
    isl.ast_expr_op_type.add: lambda a: a[0] + a[1],
    isl.ast_expr_op_type.sub: lambda a: a[0] - a[1],
    isl.ast_expr_op_type.mul: lambda a: a[0] * a[1],
    isl.ast_expr_op_type.div: lambda a: a[0] // a[1],      # exact division
    isl.ast_expr_op_type.fdiv_q: lambda a: a[0] // a[1],
    isl.ast_expr_op_type.pdiv_q: lambda a: a[0] // a[1],   # numerator known >= 0
    isl.ast_expr_op_type.pdiv_r: lambda a: a[0] % a[1],
    isl.ast_expr_op_type.zdiv_r: lambda a: a[0] % a[1],    # only ever compared with 0
    isl.ast_expr_op_type.cond: lambda a: dsl.if_then_else(_cond(a[0]), a[1], a[2]),
    isl.ast_expr_op_type.select: lambda a: dsl.if_then_else(_cond(a[0]), a[1], a[2]),
    isl.ast_expr_op_type.eq: lambda a: a[0] == a[1],
    isl.ast_expr_op_type.le: lambda a: a[0] <= a[1],
    isl.ast_expr_op_type.lt: lambda a: a[0] < a[1],
    isl.ast_expr_op_type.ge: lambda a: a[0] >= a[1],
    isl.ast_expr_op_type.gt: lambda a: a[0] > a[1],
}


def _expr(e, env) -> Expr:
    kind = e.get_type()
    if kind == isl.ast_expr_type.int:
        return dsl.const(e.get_val().to_python())
    if kind == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        if name not in env:
            # an iterator the walk has not bound where it is used (a loop's bound or guard
            # naming a loop that isl eliminated or nests inside): this scan cannot be
            # translated, so the next schedule is tried, and the callers fall back to an
            # exact form when none translates
            raise Unsupported(f"isl AST uses {name} where it is not bound (known: {', '.join(env)})")
        return env[name]
    fn = _OPS.get(e.get_op_type())
    if fn is None:
        raise Unsupported(f"isl AST operation {e.get_op_type()}")
    return fn([_expr(e.get_op_arg(i), env) for i in range(e.get_op_n_arg())])
