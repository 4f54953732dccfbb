"""A structural fingerprint of a tensor graph: equal exactly when the graphs are the same program.

``fingerprint(outputs, inputs)`` walks the graph behind ``outputs`` (producers first) and
hashes, for every tensor, its op, shape, dtype and every expression node (type, operator,
dtype, constant value with its dtype), with variables and tensors replaced by their order
of appearance and names kept (they appear in error messages). Two graphs built twice the
same way, in different processes, have the same fingerprint; any difference that could
change a value or a message changes it. The persistent kernel cache keys builds by it.
"""
from __future__ import annotations

import hashlib
from dataclasses import fields
from typing import Dict, Sequence

from .graph import topo_order
from .ir import ComputeOp, Const, Expr, PlaceholderOp, ReduceAxis, ScatterOp, SizeVar, Tensor, Var


def fingerprint(outputs: Sequence[Tensor], inputs: Sequence[Tensor], extra: str = "") -> str:
    h = hashlib.sha256()
    tensors: Dict[int, int] = {}
    variables: Dict[int, int] = {}
    nodes: Dict[int, int] = {}  # id(expression node) -> its order of first appearance

    def put(token):
        data = str(token).encode()
        h.update(len(data).to_bytes(4, "little"))
        h.update(data)

    put(extra)
    order = topo_order(list(outputs) + list(inputs))
    for t in order:
        tensors[id(t)] = len(tensors)
        put(("T", t.name, t.shape, t.dtype, type(t.op).__name__))
        if any(isinstance(n, Expr) for n in t.shape):  # size variables: their ranges too
            put(("sizes", _size_ranges(t.shape)))
        op = t.op
        if isinstance(op, PlaceholderOp):
            continue
        if isinstance(op, ComputeOp):
            for a in op.axes:
                variables[id(a)] = len(variables)
            parts = [op.body]
        elif isinstance(op, ScatterOp):
            for a in op.axes:
                variables[id(a)] = len(variables)
            parts = [a for ax in op.axes for a in (ax.lo, ax.hi)] + list(op.indices) + [op.value] + (
                [op.where] if op.where is not None else [])
        else:
            put(("unknown op", repr(op)))
            continue
        for part in parts:
            _expr(part, put, tensors, variables, nodes)
    put(("outputs", [tensors[id(t)] for t in outputs]))
    put(("inputs", [tensors[id(t)] for t in inputs]))
    return h.hexdigest()


def _size_ranges(shape) -> list:
    """``(name, min, max)`` of each size variable in ``shape``, in order of first use."""
    out, seen, stack = [], set(), [n for n in reversed(shape) if isinstance(n, Expr)]
    while stack:
        node = stack.pop()
        if isinstance(node, SizeVar):
            if id(node) not in seen:
                seen.add(id(node))
                out.append((node.name, node.lo, node.hi))
            continue
        stack.extend(reversed(node.children()))
    return out


def _expr(e: Expr, put, tensors, variables, nodes):
    """Puts the tokens of ``e``, pre-order. A node met again (a DAG: gradients share
    subexpressions) is put as a reference to its first appearance, whose tokens are complete
    by then (the stack finishes a node's subtree before anything pushed below it), so the
    token stream still determines the graph, and its length is the DAG's size, not the tree's."""
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            put(("(", len(node)))
            stack.extend(reversed(node))
            continue
        if not isinstance(node, Expr):
            put(("v", repr(node)))
            continue
        if isinstance(node, Var):  # ReduceAxis too
            if id(node) not in variables:
                variables[id(node)] = len(variables)
                if isinstance(node, ReduceAxis):
                    put(("axis", variables[id(node)], node.name, node.dtype))
                    stack.extend([node.hi, node.lo])
                    continue
            put(("var", variables[id(node)], node.name, node.dtype))
            continue
        if isinstance(node, Const):
            put(("const", repr(node.value), node.dtype))
            continue
        first = nodes.get(id(node))
        if first is not None:
            put(("ref", first))
            continue
        nodes[id(node)] = len(nodes)
        put((type(node).__name__, node.dtype))
        for f in reversed(fields(node)):
            value = getattr(node, f.name)
            if isinstance(value, Tensor):
                put(("tensor", tensors.get(id(value), value.name)))
            elif isinstance(value, (Expr, tuple)):
                stack.append(value)
            else:
                stack.append(("field", f.name, value))
