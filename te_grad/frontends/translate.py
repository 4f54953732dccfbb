"""The translator from an FX graph of ATen ops to te_grad tensors (imports no framework).

A PyTorch program captured by ``torch.export`` (or by Dynamo, for the ``torch.compile``
backend) is an FX graph: placeholders, ``call_function`` nodes on ATen operators
(``aten.convolution.default``) and Python functions on sizes (``operator.mul``), and one
output node. :class:`Translator` walks it in order and gives each node a te_grad value:

- a :class:`~te_grad.ir.Tensor` for a tensor (the rule of the node's operator builds it
  from ``te_grad.nn`` where an operator exists there, the DSL otherwise; the table lives in
  :mod:`te_grad.frontends.aten`, one rule per operator with its math);
- an int, a float, a bool, or a size expression (``tg.var``) for a ``SymInt``;
- a tuple of these for an operator with several results (read by ``operator.getitem``).

The graph's symbolic sizes (the ``SymInt`` s of ``torch.export``'s ``Dim`` s) become the
size expressions of the placeholders they came from: the extent of the te_grad input
tensor at that dimension, an int for an exact build or a ``tg.var`` for a kernel serving
every batch size. Every tensor a rule returns is checked against the node's recorded
``meta["val"]`` (its rank, its dtype, and each extent that is an int in both), so a rule that
disagrees with PyTorch on a shape fails at the node, naming it, rather than computing a wrong
number further on.

One pattern is translated as a whole: :func:`linear_folds` finds ``view(linear(view(x, (m, k)),
w, b), lead + (n,))``, a ``linear`` between a ``view`` that flattens ``x`` of shape ``lead +
kd`` into ``m = prod(lead)`` rows of ``k = prod(kd)`` and views that restore ``lead``
(``nn.MultiheadAttention``'s output projection on ``(seq, batch, heads, dim)``): the views
restoring ``lead`` get ``linear`` applied to ``x`` with only ``kd`` merged, which is the same
value, element for element (row ``r`` of the flat matrix is ``x``'s row at the row-major
position ``r`` of ``lead``, and the restoring view puts it back there). The flattened
matrix is never built: with a size variable in ``lead`` before another extent its row index
``s * batch + b`` is not affine in the sizes, so it could not be.

Before anything is built, :func:`unsupported` lists every node whose operator has no rule,
with the line of model source it came from (``meta["stack_trace"]``), and a trial walk
with ``refusals`` collects every node whose rule refuses its arguments (a 1-D convolution,
a pooling option te_grad does not take), each with its reason: an import is complete or
refused whole, never partial.
"""
from __future__ import annotations

import numbers
import operator
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from .. import dsl, dtypes
from ..errors import UserError
from ..ir import Expr, Tensor
from .views import composed

#: Python functions on sizes that appear in graphs with symbolic shapes
SIZE_FUNCTIONS: Dict[Callable, Callable] = {
    operator.mul: operator.mul, operator.add: operator.add, operator.sub: operator.sub,
    operator.floordiv: operator.floordiv, operator.neg: operator.neg,
}

#: torch dtype names (``str(torch.float32)`` without ``torch.``) to te_grad's
TORCH_DTYPES = {"float32": dtypes.FLOAT32, "float64": dtypes.FLOAT64, "int32": dtypes.INT32,
                "int64": dtypes.INT64, "bool": dtypes.BOOL, "float": dtypes.FLOAT32, "double": dtypes.FLOAT64,
                "long": dtypes.INT64, "int": dtypes.INT32}


def dtype_of(torch_dtype) -> Optional[str]:
    """te_grad's name of a torch dtype (``torch.float32`` -> ``"float32"``), None if it has none."""
    if torch_dtype is None:
        return None
    return TORCH_DTYPES.get(str(torch_dtype).replace("torch.", ""))


def op_name(node) -> str:
    """The name of a node's operator as the rule table keys it (``"aten.relu.default"``)."""
    target = node.target
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) if target in SIZE_FUNCTIONS or target is operator.getitem \
        else str(target)


def source_line(node) -> str:
    """The innermost model source line a node came from (``file:line: code``), or ``""``."""
    trace = (getattr(node, "meta", None) or {}).get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    frames = []
    for k, ln in enumerate(lines):
        if ln.startswith("File "):
            where = ln[5:].split(", in ")[0].replace('"', "")
            code = lines[k + 1] if k + 1 < len(lines) and not lines[k + 1].startswith("File ") else ""
            frames.append(f"{where}: {code}" if code else where)
    # the innermost frame of the model's code, not of torch's own modules
    own = [f for f in frames if "/torch/" not in f.replace("\\", "/")]
    return (own or frames or [""])[-1]


_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _same_size(a, b) -> bool:
    if _is_symint(a) or _is_symint(b):
        return _is_symint(a) and _is_symint(b) and _sym_expr(a) == _sym_expr(b)
    return int(a) == int(b)


def linear_folds(nodes) -> Dict[str, tuple]:
    """The ``view -> linear -> view`` chains translated as one (see the module docstring):
    ``{linear node's name: (the flattening view, [the restoring views], lead rank)}``. A chain
    qualifies when the flattening view's only user is the ``linear``, every user of the
    ``linear`` is a view to ``lead + (n,)``, the flattened input has shape ``lead + kd`` with
    ``kd`` of known extents, and the flat matrix is ``(prod lead, prod kd)``."""
    folds = {}
    for node in nodes:
        if node.op != "call_function" or op_name(node) != "aten.linear.default" or not node.args:
            continue
        flat = node.args[0]
        if getattr(flat, "op", None) != "call_function" or op_name(flat) not in _VIEWS or not flat.args \
                or list(flat.users) != [node] or not hasattr(flat.args[0], "meta") \
                or any(a is flat for a in list(node.args[1:]) + list(node.kwargs.values())):   # read once, as x
            continue
        shape_of = lambda n: getattr(n.meta.get("val"), "shape", None)  # noqa: E731
        xs, fs, ls = shape_of(flat.args[0]), shape_of(flat), shape_of(node)
        views = list(node.users)
        if xs is None or fs is None or ls is None or len(fs) != 2 or not views:
            continue
        outs = [shape_of(v) if getattr(v, "op", None) == "call_function" and op_name(v) in _VIEWS else None
                for v in views]
        if any(o is None for o in outs):
            continue
        lead = len(outs[0]) - 1
        if lead < 1 or lead > len(xs) or (lead == 1 and len(xs) == 2):
            continue
        kd = xs[lead:]
        if not kd or any(_is_symint(d) for d in kd) or _is_symint(fs[1]):
            continue
        width = 1
        for d in kd:
            width *= int(d)
        if width != int(fs[1]) or any(len(o) != lead + 1 or not _same_size(o[-1], ls[-1])
                                      or not all(_same_size(a, b) for a, b in zip(o[:-1], xs[:lead])) for o in outs):
            continue
        folds[node.name] = (flat, views, lead)
    return folds


def unsupported(nodes, rules: Mapping[str, Callable]) -> List[str]:
    """One line per node with no rule: ``op (source line)``; empty when every node is covered."""
    out = []
    for node in nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem or node.target in SIZE_FUNCTIONS:
            continue
        name = op_name(node)
        if name not in rules:
            where = source_line(node)
            out.append(f"{name}" + (f" (at {where})" if where else f" (node {node.name})"))
    return out


def check_supported(nodes, rules: Mapping[str, Callable], what: str) -> None:
    """A :class:`UserError` listing every unsupported operator of ``nodes`` with its source line
    (once per operator and line: the nodes of several programs of one model may repeat them)."""
    missing = list(dict.fromkeys(unsupported(nodes, rules)))  # one line per operator and source line
    if missing:
        ops = sorted({m.split(" ")[0] for m in missing})
        lines = "\n  ".join(missing)
        raise UserError(f"{what}: {len(missing)} use(s) of ATen operators te_grad does not translate "
                        f"({', '.join(ops)}):\n  {lines}")


class Translator:
    """Gives te_grad values to the nodes of an FX graph (see the module docstring).

    ``env`` maps the graph's placeholder nodes (by name) to their values; ``rules`` is the
    operator table (:data:`te_grad.frontends.aten.RULES`); ``context`` is what rules with
    side information read (the dropout seed and mode: :class:`te_grad.train.Context`)."""

    def __init__(self, rules: Mapping[str, Callable], context=None, where: str = "import",
                 refusals: Optional[List[str]] = None):
        self.rules = rules
        self.context = context
        self.where = where
        #: when a list, a rule's refusal is recorded there and the node gets a stand-in of its
        #: recorded shape and dtype, so that one walk finds every refusal of a graph
        self.refusals = refusals
        self.values: Dict[str, object] = {}
        self.symbols: Dict[object, object] = {}    # sympy symbol -> te_grad size (int or size expression)
        self.node = None                           # the node being translated (for rules' messages)

    # -- sizes ---------------------------------------------------------------------------------
    def bind_placeholder(self, node, value) -> None:
        """Give placeholder ``node`` its value, and learn the graph's size symbols from its shape."""
        self.values[node.name] = value
        val = node.meta.get("val") if hasattr(node, "meta") else None
        shape = getattr(val, "shape", None)
        if shape is None or not isinstance(value, Tensor):
            if _is_symint(val) and isinstance(value, (int, Expr)):
                self.symbols.setdefault(_sym_expr(val), value)
            return
        if len(shape) != value.ndim:
            raise UserError(f"{self.where}: input {node.name} has rank {value.ndim}, the captured "
                            f"program expects rank {len(shape)} (shape {list(shape)})")
        for d, s in enumerate(shape):
            if _is_symint(s):
                expr = _sym_expr(s)
                if getattr(expr, "is_Symbol", False):
                    self.symbols.setdefault(expr, value.shape[d])
            elif isinstance(value.shape[d], numbers.Integral) and int(s) != value.shape[d]:
                raise UserError(f"{self.where}: input {node.name} has extent {value.shape[d]} in dimension "
                                f"{d}, the captured program was traced with {int(s)} there")

    def size(self, s):
        """A graph size (an int, a ``SymInt``, a sympy expression) as a te_grad size."""
        if isinstance(s, bool):
            return s
        if isinstance(s, numbers.Integral):
            return int(s)
        if isinstance(s, (Expr,)):
            return s
        if _is_symint(s):
            hint = _hint(s)
            return self._sympy(_sym_expr(s), hint)
        return s

    def _sympy(self, e, hint=None):
        if getattr(e, "is_Integer", False):
            return int(e)
        if getattr(e, "is_Symbol", False):
            if e in self.symbols:
                return self.symbols[e]
            if hint is not None:
                return hint
            raise UserError(f"{self.where}: the size {e} is not an extent of any input")
        name = type(e).__name__
        args = [self._sympy(a) for a in e.args]
        if name == "Add":
            out = args[0]
            for a in args[1:]:
                out = out + a
            return out
        if name == "Mul":
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if name == "FloorDiv":
            return args[0] // args[1]
        if hint is not None:
            return hint
        raise UserError(f"{self.where}: cannot translate the size expression {e}")

    # -- the walk ------------------------------------------------------------------------------
    def value(self, a):
        """A node argument with the values of the nodes it names substituted (recursively)."""
        if hasattr(a, "op") and hasattr(a, "name") and hasattr(a, "meta"):
            if a.name not in self.values:
                raise UserError(f"{self.where}: node {a.name} is used before it has a value")
            return self.values[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        if isinstance(a, dict):
            return {k: self.value(v) for k, v in a.items()}
        return self.size(a)

    def run(self, nodes) -> object:
        """Translate ``nodes`` (placeholders already bound); returns the output node's value."""
        nodes = list(nodes)
        folds = linear_folds(nodes)
        folded = {flat.name for flat, _, _ in folds.values()}
        for flat, views, _ in folds.values():
            folded.update(v.name for v in views)
        for node in nodes:
            if node.name in folded:   # translated with its linear
                continue
            if node.name in folds:
                flat, views, lead = folds[node.name]
                out = self.call_folded(node, flat, lead)
                for v in views:
                    self.values[v.name] = self._checked(v, op_name(v), out) \
                        if not isinstance(out, Tensor) or out.ndim == lead + 1 \
                        else self._stand_in(v.meta.get("val"), v.name)   # the linear refused: its stand-in
                continue
            if node.op == "placeholder":
                if node.name not in self.values:
                    raise UserError(f"{self.where}: no value given for input {node.name}")
                continue
            if node.op == "output":
                return self.value(node.args[0])
            if node.op == "get_attr":
                raise UserError(f"{self.where}: get_attr node {node.name} ({node.target}) is not translated; "
                                "parameters and buffers must be inputs of the captured program")
            if node.op != "call_function":
                raise UserError(f"{self.where}: node {node.name} of kind {node.op} is not translated")
            self.values[node.name] = self.call(node)
        return None

    def call_folded(self, node, flat, lead: int):
        """The ``linear`` ``node`` of a fold, applied to the input of its flattening view ``flat``
        with the axes after the first ``lead`` merged (a no-op when there is one)."""
        x = self.value(flat.args[0])
        if isinstance(x, Tensor) and x.ndim != lead + 1:
            from ..nn import reshape
            width = 1
            for d in x.shape[lead:]:
                width *= d
            x = composed(reshape(x, tuple(x.shape[:lead]) + (width,), name=flat.name))
        return self.call(node, [x] + [self.value(a) for a in node.args[1:]], checked=False)

    def call(self, node, args=None, checked: bool = True):
        if args is None:
            args = [self.value(a) for a in node.args]
        kwargs = {k: self.value(v) for k, v in node.kwargs.items()}
        if node.target is operator.getitem:
            got = args[0][args[1]]
            if got is None and node.users:  # a result the rule does not give (pooling's indices)
                source = node.args[0]
                readers = ", ".join(sorted(u.name for u in node.users))
                return self._refuse(node, source, f"result {args[1]} of {op_name(source)} is not translated, "
                                    f"and {readers} read(s) it")
            return got
        if node.target in SIZE_FUNCTIONS:
            return SIZE_FUNCTIONS[node.target](*args)
        name = op_name(node)
        rule = self.rules.get(name)
        if rule is None:
            check_supported([node], self.rules, self.where)
        self.node = node
        try:
            out = rule(self, *args, **kwargs)
        except UserError as e:
            return self._refuse(node, node, str(e))
        out = composed(out) if isinstance(out, Tensor) else out   # a view of a view: one view
        return self._checked(node, name, out) if checked else out

    def _refuse(self, node, culprit, why: str):
        """``node`` is not translated, because of the operator node ``culprit`` (``node`` itself,
        or the operator whose result it takes), for the reason ``why``. When refusals are
        collected (:attr:`refusals`), the refusal is recorded there (the operator, its source
        line, ``why``) and ``node`` gets a stand-in of its recorded shape and dtype, so that the
        walk goes on; otherwise, or when no stand-in can be made, a :class:`UserError` says it."""
        name, where = op_name(culprit), source_line(culprit)
        if self.refusals is not None:
            try:
                stand_in = self._stand_in(node.meta.get("val"), node.name)
            except UserError:  # a recorded size te_grad cannot name: report the refusal itself
                stand_in = None
            if stand_in is not None:
                self.refusals.append(f"{name} (" + (f"at {where}" if where else f"node {culprit.name}") + f"): {why}")
                return stand_in
        err = UserError(f"{self.where}: {name} at node {culprit.name}" + (f" ({where})" if where else "")
                        + f": {why}")
        err.reason = why  # the reason alone, for a caller that names the node and line itself
        raise err from None

    def _stand_in(self, val, name: str):
        """A placeholder of the recorded shape and dtype ``val`` (a fake tensor, or a tuple of
        them), None if there is none."""
        if isinstance(val, (tuple, list)):
            parts = [None if v is None else self._stand_in(v, f"{name}_{k}") for k, v in enumerate(val)]
            return None if any(p is None and v is not None for p, v in zip(parts, val)) else type(val)(parts)
        shape, dtype = getattr(val, "shape", None), dtype_of(getattr(val, "dtype", None))
        if shape is None or dtype is None:
            return None
        return dsl.placeholder(tuple(self.size(d) for d in shape), dtype=dtype, name=f"{name}_refused")

    def _checked(self, node, name, out):
        val = node.meta.get("val")
        if isinstance(out, Tensor):
            want = dtype_of(getattr(val, "dtype", None))
            shape = getattr(val, "shape", None)
            if shape is not None:
                if len(shape) != out.ndim:
                    raise UserError(f"{self.where}: {name} at node {node.name}: te_grad gives rank {out.ndim} "
                                    f"{list(out.shape)}, PyTorch {len(shape)} {list(shape)}")
                for d, s in enumerate(shape):
                    if not _is_symint(s) and isinstance(out.shape[d], numbers.Integral) and int(s) != out.shape[d]:
                        raise UserError(f"{self.where}: {name} at node {node.name}: te_grad gives shape "
                                        f"{list(out.shape)}, PyTorch {list(shape)}")
            if want is not None and want != out.dtype:
                out = dsl.compute(out.shape, lambda *i, o=out: dsl.cast(want, o[i]), name=f"{node.name}_cast")
        elif isinstance(out, (tuple, list)) and isinstance(val, (tuple, list)):
            return type(out)(o if v is None or o is None else self._checked_item(node, name, o, v)
                             for o, v in zip(out, val))
        return out

    def _checked_item(self, node, name, out, val):
        if not isinstance(out, Tensor):
            return out
        want = dtype_of(getattr(val, "dtype", None))
        if want is not None and want != out.dtype:
            out = dsl.compute(out.shape, lambda *i, o=out: dsl.cast(want, o[i]), name=f"{node.name}_cast")
        return out


def _is_symint(v) -> bool:
    return type(v).__name__ in ("SymInt", "SymFloat", "SymBool")


def _sym_expr(v):
    return v.node.expr


def _hint(v):
    try:
        return v.node.hint
    except AttributeError:  # pragma: no cover - older torch
        return None


def translate(nodes: Sequence, inputs: Mapping[str, object], rules: Mapping[str, Callable], context=None,
              where: str = "import", refusals: Optional[List[str]] = None):
    """Translate a whole graph: ``inputs`` gives each placeholder (by name) its value. With
    ``refusals`` (a list) every rule's refusal is appended there (``op (source line): why``)
    and the walk goes on past it (see :class:`Translator`)."""
    t = Translator(rules, context, where, refusals)
    nodes = list(nodes)
    check_supported(nodes, rules, where)
    for node in nodes:
        if node.op == "placeholder":
            if node.name not in inputs:
                raise UserError(f"{where}: no value given for input {node.name}")
            t.bind_placeholder(node, inputs[node.name])
    return t.run(nodes)
