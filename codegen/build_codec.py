"""A build as JSON-safe data (for the disk cache): no pickle, nothing executed on load.

:func:`encode` turns a value made of te_grad's IR (tensors, ops, expressions), the loop
IR of :mod:`.loopir` (stages, statements, loop kinds), tuples, lists, dicts with string
keys, strings, numbers, booleans and None into ``{"nodes": [...], "root": ...}``: every
IR object is one entry of a table, referred to by its position (``{"r": n}``), so shared
nodes stay shared (a variable is one object wherever it appears) and the JSON is flat
whatever the depth of the graph. Each node names its class from a fixed table and its
constructor's fields; :func:`decode` builds the objects again through their constructors
(children first), which recompute the hashes, depths and dtypes. Anything else (an
unknown class, a malformed node, a reference forward) is a :class:`ValueError`.
"""
from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from typing import Dict, List

from te_grad import ir as _ir
from te_grad.ir import Tensor

from . import loopir as _loopir

_CLASSES = {f"ir.{c.__name__}": c for c in (
    _ir.Const, _ir.Var, _ir.SizeVar, _ir.ReduceAxis, _ir.Binary, _ir.Unary, _ir.Compare, _ir.Select, _ir.Call,
    _ir.Cast, _ir.Read, _ir.Reduce, _ir.PlaceholderOp, _ir.ComputeOp, _ir.ScatterOp)}
_CLASSES.update({f"loopir.{c.__name__}": c for c in (
    _loopir.Serial, _loopir.Parallel, _loopir.Jam, _loopir.RegisterBlocked, _loopir.Transposed,
    _loopir.Carried, _loopir.Loop, _loopir.If, _loopir.Store, _loopir.Stage)})
_NAMES = {c: name for name, c in _CLASSES.items()}
_FIELDS = {c: tuple(f.name for f in fields(c) if f.init) for c in _CLASSES.values()}


def _children(obj):
    """The values inside ``obj`` that become nodes of their own (or containers of them)."""
    if isinstance(obj, Tensor):
        return (obj.op,) + tuple(n for n in obj.shape if isinstance(n, _ir.Expr))
    if type(obj) in _FIELDS:
        return tuple(getattr(obj, n) for n in _FIELDS[type(obj)])
    if isinstance(obj, (tuple, list)):
        return tuple(obj)
    if isinstance(obj, dict):
        return tuple(obj.values())
    return ()


def encode(value) -> dict:
    """``value`` as JSON-safe data (see the module docstring); ValueError for what it cannot hold."""
    index: Dict[int, int] = {}
    nodes: List[dict] = []
    keep = []  # the objects indexed by id stay alive while encoding

    def ref(v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return v if math.isfinite(v) else {"f": repr(v)}
        if isinstance(v, tuple):
            return {"t": [ref(x) for x in v]}
        if isinstance(v, list):
            return {"l": [ref(x) for x in v]}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise ValueError("a dict with keys other than strings")
            return {"d": {k: ref(x) for k, x in v.items()}}
        return {"r": index[id(v)]}

    # post-order without recursion: every node's children are in the table before it
    stack = [(value, False)]
    while stack:
        obj, ready = stack.pop()
        is_node = isinstance(obj, Tensor) or type(obj) in _FIELDS
        if is_node and id(obj) in index:
            continue
        if not is_node and not isinstance(obj, (tuple, list, dict)):
            if obj is None or isinstance(obj, (bool, int, float, str)):
                continue
            raise ValueError(f"cannot encode a {type(obj).__name__}")
        if not ready:
            stack.append((obj, True))
            stack.extend((c, False) for c in reversed(_children(obj)))
            continue
        if not is_node:
            continue
        keep.append(obj)
        if isinstance(obj, Tensor):
            # an extent is an int, or a size expression (a reference to its node)
            node = {"c": "Tensor", "name": obj.name,
                    "shape": [ref(s) if isinstance(s, _ir.Expr) else int(s) for s in obj.shape],
                    "dtype": obj.dtype, "op": ref(obj.op)}
        else:
            if is_dataclass(obj) and type(obj) not in _NAMES:
                raise ValueError(f"cannot encode a {type(obj).__name__}")
            node = {"c": _NAMES[type(obj)], "f": {n: ref(getattr(obj, n)) for n in _FIELDS[type(obj)]}}
        index[id(obj)] = len(nodes)
        nodes.append(node)
    return {"nodes": nodes, "root": ref(value)}


def decode(data: dict):
    """The value :func:`encode` gave ``data`` for; ValueError if ``data`` is not such a value."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list) or "root" not in data:
        raise ValueError("not an encoded value")
    built: list = []

    def val(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, dict) and len(v) == 1:
            (tag, x), = v.items()
            if tag == "r" and type(x) is int and 0 <= x < len(built):
                return built[x]
            if tag == "t" and isinstance(x, list):
                return tuple(val(y) for y in x)
            if tag == "l" and isinstance(x, list):
                return [val(y) for y in x]
            if tag == "d" and isinstance(x, dict):
                return {k: val(y) for k, y in x.items()}
            if tag == "f" and x in ("inf", "-inf", "nan"):
                return float(x)
        raise ValueError(f"malformed value {str(v)[:80]}")

    for node in data["nodes"]:
        if not isinstance(node, dict):
            raise ValueError("malformed node")
        name = node.get("c")
        try:
            if name == "Tensor":
                shape = node["shape"]
                if not isinstance(shape, list) or not all(type(s) is int and s >= 0 or isinstance(s, dict)
                                                          for s in shape):
                    raise ValueError("malformed shape")
                shape = [val(s) for s in shape]
                if not all(type(s) is int or isinstance(s, _ir.Expr) for s in shape):
                    raise ValueError("malformed shape")
                built.append(Tensor(str(node["name"]), tuple(shape), str(node["dtype"]), val(node["op"])))
                continue
            cls = _CLASSES.get(name) if isinstance(name, str) else None
            given = node.get("f")
            if cls is None or not isinstance(given, dict) or set(given) != set(_FIELDS[cls]):
                raise ValueError(f"malformed node of class {str(name)[:40]}")
            if cls is _loopir.Serial:
                built.append(_loopir.SERIAL)
                continue
            built.append(cls(**{n: val(v) for n, v in given.items()}))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"malformed node: {err}") from None
    return val(data["root"])
