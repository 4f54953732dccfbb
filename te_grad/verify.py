"""The IR verifier: checks that a tensor graph is well formed, and names the stage that broke it.

``verify(tensors, stage)`` walks every tensor behind ``tensors`` and checks what
every pass relies on:

- a compute has one index variable per dimension, all distinct, and its body uses
  no variable it does not bind (an index variable of another compute, a reduce
  axis outside its reduction, or an axis whose bounds use a later axis);
- dtypes agree: operands of an arithmetic node share a dtype, conditions are
  ``bool``, indices are integers, a body has its tensor's dtype;
- every read has one index per dimension of its tensor; every intrinsic and
  reduction kind is in the op table with the right number of arguments;
- a scatter's indices, value and condition use only its own axes.

A violation is an :class:`~te_grad.errors.InternalError` that says which stage
produced the graph (``"autodiff"``, ``"simplify"``, ...) and what is wrong where.
Tests run it between stages; ``TE_GRAD_VERIFY=1`` (the default of the compile options'
``verify``, see :mod:`codegen.options`), or ``with codegen.options.compile_options(verify=True):``,
makes ``tg.differentiate``, ``tg.simplify`` and ``tg.build`` run it on everything they produce.
"""
from __future__ import annotations

from typing import List

from . import dtypes, ops
from .checking import enabled
from .errors import InternalError
from .graph import topo_order
from .ir import (Binary, Call, Cast, Compare, ComputeOp, Const, Expr, PlaceholderOp, Read, Reduce, ReduceAxis, SizeVar,
                 ScatterOp, Select, Tensor, Unary, Var)


def verify(tensors, stage: str = "the caller") -> None:
    """Raise an InternalError naming ``stage`` if the graph behind ``tensors`` is malformed."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    for t in topo_order(list(tensors)):
        problems = _problems(t)
        if problems:
            raise InternalError(f"malformed IR after {stage}: in tensor {t.name}: {problems[0]}"
                                + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def verify_if_enabled(tensors, stage: str) -> None:
    if enabled():
        verify(tensors, stage)


def _problems(t: Tensor) -> List[str]:
    op = t.op
    out: List[str] = []
    if isinstance(op, PlaceholderOp):
        return out
    if isinstance(op, ComputeOp):
        if len(op.axes) != t.ndim:
            out.append(f"{len(op.axes)} index variables for {t.ndim} dimensions")
        if len({id(a) for a in op.axes}) != len(op.axes):
            out.append("an index variable appears twice")
        if op.body.dtype != t.dtype:
            out.append(f"the body has dtype {op.body.dtype}, the tensor {t.dtype}")
        _check(op.body, {id(a) for a in op.axes}, out)
        return out
    if isinstance(op, ScatterOp):
        bound = set()
        for ax in op.axes:
            _check(ax.lo, bound, out)
            _check(ax.hi, bound, out)
            bound.add(id(ax))
        if len(op.indices) != t.ndim:
            out.append(f"{len(op.indices)} scatter indices for {t.ndim} dimensions")
        for ix in op.indices:
            _check(ix, bound, out)
            if not dtypes.is_int(ix.dtype):
                out.append(f"scatter index {ix} has dtype {ix.dtype}")
        _check(op.value, bound, out)
        if op.where is not None:
            _check(op.where, bound, out)
        return out
    out.append(f"unknown op {type(op).__name__}")
    return out


def _check(e: Expr, bound: set, out: List[str]) -> None:
    """Append to ``out`` what is wrong in ``e``, where the variables ``bound`` are in scope."""
    stack = [(e, frozenset(bound))]
    walked = set()  # (node, scope): a node shared by several parents is checked once per scope
    while stack:
        node, scope = stack.pop()
        if (id(node), scope) in walked:
            continue
        walked.add((id(node), scope))
        if not isinstance(node, Expr):
            out.append(f"{node!r} is not an expression")
            continue
        if isinstance(node, Var):  # ReduceAxis too
            if id(node) not in scope:
                kind = "reduce axis" if isinstance(node, ReduceAxis) else "variable"
                out.append(f"{kind} {node.name} is used where it is not bound")
            continue
        if isinstance(node, SizeVar):
            if node.dtype != dtypes.INDEX or not isinstance(node.lo, int) or node.lo < 0:
                out.append(f"size variable {node.name} is malformed")
            continue
        if isinstance(node, Const):
            if node.dtype not in dtypes.DTYPES:
                out.append(f"constant {node.value!r} has unknown dtype {node.dtype}")
            continue
        if isinstance(node, Reduce):
            if node.combiner not in ops.REDUCTIONS:
                out.append(f"unknown reduction kind {node.combiner}")
            inner = set(scope)
            for ax in node.axes:
                if not isinstance(ax, ReduceAxis):
                    out.append(f"reduction over {ax!r}, which is not a reduce axis")
                    continue
                if id(ax) in scope:
                    out.append(f"reduce axis {ax.name} is reduced over inside its own reduction")
                stack.append((ax.lo, frozenset(inner)))
                stack.append((ax.hi, frozenset(inner)))
                inner.add(id(ax))
            inner = frozenset(inner)
            stack.append((node.body, inner))
            if node.where is not None:
                if node.where.dtype != dtypes.BOOL:
                    out.append(f"the where of a reduction has dtype {node.where.dtype}")
                stack.append((node.where, inner))
            continue
        _local(node, out)
        stack.extend((c, scope) for c in node.children())


def _local(node: Expr, out: List[str]) -> None:
    if isinstance(node, Binary):
        if node.a.dtype != node.b.dtype:
            out.append(f"operands of {node.op} have dtypes {node.a.dtype} and {node.b.dtype}")
        if node.op in ("and", "or") and node.a.dtype != dtypes.BOOL:
            out.append(f"'{node.op}' of non-conditions")
        elif node.op not in ("and", "or") and node.op not in ops.BINARY_OPS:
            out.append(f"unknown operator {node.op}")
    elif isinstance(node, Compare):
        if node.a.dtype != node.b.dtype:
            out.append(f"a comparison of dtypes {node.a.dtype} and {node.b.dtype}")
    elif isinstance(node, Select):
        if node.cond.dtype != dtypes.BOOL:
            out.append(f"if_then_else on a condition of dtype {node.cond.dtype}")
        if node.t.dtype != node.f.dtype:
            out.append(f"if_then_else branches of dtypes {node.t.dtype} and {node.f.dtype}")
    elif isinstance(node, Call):
        op = ops.INTRINSICS.get(node.name)
        if op is None:
            out.append(f"unknown intrinsic {node.name}")
        elif len(node.args) != op.arity:
            out.append(f"{node.name} with {len(node.args)} arguments")
        elif any(a.dtype != node.args[0].dtype or not dtypes.is_float(a.dtype) for a in node.args):
            out.append(f"{node.name} of arguments of dtypes {[a.dtype for a in node.args]}")
    elif isinstance(node, Read):
        if len(node.indices) != node.tensor.ndim:
            out.append(f"{node.tensor.name} read with {len(node.indices)} indices, it has {node.tensor.ndim} "
                       "dimensions")
        for ix in node.indices:
            if not dtypes.is_int(ix.dtype):
                out.append(f"index {ix} of {node.tensor.name} has dtype {ix.dtype}")
    elif isinstance(node, Cast):
        if node.dtype not in dtypes.DTYPES:
            out.append(f"a cast to unknown dtype {node.dtype}")
    elif isinstance(node, Unary):
        if node.op not in ("neg", "not"):
            out.append(f"unknown unary operator {node.op}")
    else:
        out.append(f"unknown node {type(node).__name__}")
