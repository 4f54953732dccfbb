"""Static proofs that every read stays inside its tensor.

For each read ``X[g(v)]`` the context is: the bounds of every variable in
scope (output indices, reduce axes), and the quasi-affine conditions that hold
wherever the read is evaluated (the taken branch of an ``if_then_else``, the
right operand of ``&`` / ``|``, a reduction's ``where``). isl decides whether
some point of the context puts ``g`` outside ``[0, shape)``:
- no such point: proven safe;
- such a point, and every condition on the way was quasi-affine: the read
  really can go out of bounds, a UserError names the read, the tensor and
  that point;
- otherwise (a data-dependent index, or a data-dependent guard on the way):
  it cannot be decided statically and is reported as needing a run-time check.

Size variables are isl parameters constrained by their ranges: a proof holds for every
size, and a violation names the sizes where it happens (``at n=0, i=...``). A shape or a
bound that isl cannot represent (a product of two sizes) makes the reads it bounds
undecidable: they are checked at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

from te_grad import dsl
from te_grad.errors import UserError
from te_grad.graph import topo_order
from te_grad.ir import Binary, ComputeOp, Const, Expr, Read, Reduce, ScatterOp, Select, Tensor, Var
from te_grad.printer import expr_to_str

from .affine import IslNames, conjuncts, isl_cond, isl_expr
from .isl_bridge import Domain
from .linear import normalize


@dataclass
class RuntimeCheck:
    """A read whose bounds isl cannot decide: ``tensor``'s body reads ``read``."""
    tensor: Tensor
    read: Read

    def __str__(self):
        return f"{expr_to_str(self.read)} in {self.tensor.name}"


class _Context:
    def __init__(self, tensor: Tensor):
        self.tensor = tensor
        self.names: Dict[int, str] = IslNames()
        self.vars: List[Var] = []
        self.bounds: List[str] = []
        self.conds: List[str] = []
        self.opaque = 0

    def bind(self, v: Var, lo: Expr, hi: Expr) -> bool:
        name = f"v{len(self.vars)}"
        self.names[id(v)] = name
        self.vars.append(v)
        lo_s, hi_s = isl_expr(lo, self.names), isl_expr(hi, self.names)
        if lo_s is None or hi_s is None:
            self.opaque += 1
            return False
        self.bounds.append(f"{lo_s} <= {name} < {hi_s}")
        return True


class _Checker:
    def __init__(self, tensor: Tensor, runtime: List[RuntimeCheck]):
        self.tensor = tensor
        self.ctx = _Context(tensor)
        self.runtime = runtime
        # (node, context) pairs already checked: a node shared by several parents (a DAG) is
        # checked once per context, not once per path
        self.seen = set()

    def under(self, cond: Expr, negate: bool, fn):
        """Run ``fn`` where ``cond`` (or its negation) holds: its quasi-affine conjuncts join the context.
        The condition's constant logic is folded first (``1.5 > 0.5`` is true, ``true & (j < 2)``
        is ``j < 2``), as the scheduler folds it: a guard that folds to true constrains nothing
        and is not opaque, so a read under it is proven or refused as an unconditional one (the
        scheduler drops such a guard, and the emitter checks only reads under guards it cannot
        decide); code under a guard that folds to false never runs (its reads stay unproven)."""
        cond = normalize(cond)
        if isinstance(cond, Const):
            dead = bool(cond.value) == negate
            self.ctx.opaque += dead
            fn()
            self.ctx.opaque -= dead
            return
        parts = [cond] if negate else conjuncts(cond)
        texts = [isl_cond(c, self.ctx.names, negate) for c in parts]
        known = [t for t in texts if t is not None]
        opaque = len(known) < len(texts)
        self.ctx.conds.extend(known)
        self.ctx.opaque += opaque
        fn()
        self.ctx.opaque -= opaque
        del self.ctx.conds[len(self.ctx.conds) - len(known):]

    def visit(self, e: Expr):
        if e.children():
            key = (id(e), tuple(self.ctx.conds), tuple(map(id, self.ctx.vars)), self.ctx.opaque)
            if key in self.seen:
                return
            self.seen.add(key)
        if isinstance(e, Read):
            for ix in e.indices:
                self.visit(ix)
            self.check(e)
        elif isinstance(e, Select):
            self.visit(e.cond)
            self.under(e.cond, False, lambda: self.visit(e.t))
            self.under(e.cond, True, lambda: self.visit(e.f))
        elif isinstance(e, Binary) and e.op in ("and", "or"):
            self.visit(e.a)
            self.under(e.a, e.op == "or", lambda: self.visit(e.b))
        elif isinstance(e, Reduce):
            self.visit_reduce(e)
        else:
            for c in e.children():
                self.visit(c)

    def visit_reduce(self, e: Reduce):
        saved = (len(self.ctx.bounds), self.ctx.opaque, len(self.ctx.vars))
        for ax in e.axes:
            self.visit(ax.lo)
            self.visit(ax.hi)
            self.ctx.bind(ax, ax.lo, ax.hi)
        if e.where is not None:
            self.visit(e.where)
            self.under(e.where, False, lambda: self.visit(e.body))
        else:
            self.visit(e.body)
        del self.ctx.bounds[saved[0]:]
        self.ctx.opaque = saved[1]
        for v in self.ctx.vars[saved[2]:]:
            del self.ctx.names[id(v)]
        del self.ctx.vars[saved[2]:]

    def check(self, read: Read):
        t = read.tensor
        for d, ix in enumerate(read.indices):
            g = isl_expr(ix, self.ctx.names)
            if g is None:
                self.runtime.append(RuntimeCheck(self.tensor, read))
                return
            extent = isl_expr(t.shape[d], self.ctx.names) if isinstance(t.shape[d], Expr) else t.shape[d]
            if extent is None:
                self.runtime.append(RuntimeCheck(self.tensor, read))
                return
            outside = f"({g} < 0 or {g} >= {extent})"
            dom = Domain([], [(self.ctx.names[id(v)], v.name) for v in self.ctx.vars],
                         self.ctx.bounds + self.ctx.conds + [outside], sizes=self.ctx.names.size_vars())
            point = dom.sample()
            if point is None:
                continue
            if self.ctx.opaque:
                self.runtime.append(RuntimeCheck(self.tensor, read))
                return
            at = ", ".join([f"{v.name}={point[n]}" for n, v in dom.sizes] +
                           [f"{v.name}={point[self.ctx.names[id(v)]]}" for v in self.ctx.vars])
            raise UserError(f"read {expr_to_str(read)} in {self.tensor.name} can go out of bounds: at {at} "
                            f"index {d} leaves [0, {t.shape[d]}) of tensor {t.name} with shape "
                            f"{_shape_text(t.shape)}")


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def check_tensor(t: Tensor, runtime: List[RuntimeCheck]):
    """Prove the reads of ``t`` in bounds, raise on a reachable violation, collect undecidable reads."""
    checker = _Checker(t, runtime)
    if isinstance(t.op, ComputeOp):
        for ax, n in zip(t.op.axes, t.shape):
            checker.ctx.bind(ax, dsl.const(0), n if isinstance(n, Expr) else dsl.const(n))
        checker.visit(t.op.body)
    elif isinstance(t.op, ScatterOp):
        op = t.op
        for ax in op.axes:
            checker.visit(ax.lo)  # a ragged bound reads data (rowptr[v + 1]): checked too
            checker.visit(ax.hi)
            checker.ctx.bind(ax, ax.lo, ax.hi)
        target = Read(t, op.indices)  # the elements the scatter writes

        def visit_all():
            for part in list(op.indices) + [op.value]:
                checker.visit(part)
            checker.check(target)

        if op.where is None:
            visit_all()
        else:
            checker.visit(op.where)
            checker.under(op.where, False, visit_all)


def check_bounds(tensors: Sequence[Tensor]) -> List[RuntimeCheck]:
    """Check every read of the graph behind ``tensors``; return the reads needing run-time checks."""
    runtime: List[RuntimeCheck] = []
    for t in topo_order(list(tensors)):
        check_tensor(t, runtime)
    return runtime
