"""``torch.compile(model, backend=te_grad.torch.backend)``: te_grad kernels behind Dynamo.

::

    import torch, te_grad.torch as tgt

    fast = torch.compile(net, backend=tgt.backend)
    loss = loss_fn(fast(x), y); loss.backward(); opt.step()   # te_grad forward and backward kernels
    with torch.no_grad():
        y = fast(x_other_batch)                               # inference, another batch size

What the backend does with each graph Dynamo hands it (a ``GraphModule`` on ``FakeTensor`` s,
parameters and buffers among its inputs):

1. **An ATen graph.** ``torch._functorch.aot_autograd.aot_export_module(gm, inputs,
   trace_joint=False, decompositions=...)``, under Dynamo's own fake mode (so the graph's
   ``SymInt`` s are Dynamo's, with the same guards), decomposes the graph to PyTorch's core ATen
   opset (``torch._decomp.core_aten_decompositions()`` less :data:`te_grad.frontends.aten.KEEP`)
   and functionalizes it: batch norm's in-place update of its running statistics becomes
   ``_native_batch_norm_legit_functional`` with the new statistics as extra outputs, which the
   compiled function writes back into the buffers after each call (without autograd), as
   ``aot_autograd`` does. Only the forward graph is traced (``trace_joint=False``): no ATen
   backward exists anywhere. ``make_fx`` over ``functionalize`` was the other candidate; in torch
   2.13 it leaves batch norm's mutating form in the graph, so the export path is used.
   (Composite operators such as ``scaled_dot_product_attention`` are decomposed before the
   table is consulted on this path; ``KEEP`` is removed from the table for when they are not.)
   A ``torch.no_grad()`` block of ``forward`` (Dynamo's grad-mode switches) is traced as
   ``detach`` of each of its results read after it, the switches removed: the same values, no
   gradient through them. A block that changes a tensor made before it in place (a buffer's
   running average, a parameter, an activation) would be differentiated through the export's
   functional form, where PyTorch records nothing: such a graph runs in PyTorch, noted. The
   export's ``_assert_tensor_metadata`` checks (one on the operand of each dtype conversion) are
   dropped, as inductor drops them: a check reading a node inside a partition would make that
   node a partition output.
2. **Partitions.** ``CapabilityBasedPartitioner`` groups the nodes te_grad translates (an
   operator with a rule in :data:`te_grad.frontends.aten.RULES`, a tensor result of a dtype
   te_grad takes) into connected subgraphs. Each subgraph is translated once at compile time
   on placeholders of its inputs' shapes (a dynamic dimension as a size variable); a node whose
   rule refuses it (a ``UserError`` or other failure), or a subgraph output te_grad does not
   compute, is taken out of the supported set and the graph partitioned again.
3. **One te_grad op per partition.** Each partition becomes a :func:`te_grad.torch.custom_op`
   whose ``fn`` is the partition's translation (:class:`te_grad.frontends.translate.Translator`):
   its forward kernel computes the partition's outputs and its backward kernel the gradients te_grad
   derives for it (:func:`te_grad.build_vjp`), from the residuals its forward saved. PyTorch's
   autograd connects the te_grad ops with the nodes left to PyTorch: training works through
   ``loss.backward()`` and any ``torch.optim`` optimizer, and under ``torch.no_grad`` no backward
   is built.
4. **Fallbacks.** Every other tensor node runs in PyTorch, in the graph, as Dynamo traced it.
   Each is reported once per backend (per operator, source line and reason) as a
   :class:`FallbackWarning` (``warnings.warn``; filter it with
   ``warnings.simplefilter("ignore", tgt.FallbackWarning)``):
   ``te_grad backend: aten.cumprod.default at model.py:12: y = x.cumprod(1) runs in PyTorch (no
   te_grad rule)``. Size arithmetic (``sym_size``, ``operator.mul`` on sizes) runs in PyTorch
   silently.

Dynamic shapes: when Dynamo recompiles a graph with symbolic sizes (a second batch size under
the default settings, ``dynamic=True``, ``mark_dynamic``), an input dimension of a te_grad op
whose extent is a ``SymInt`` is declared dynamic (``dynamic_dims``): the op's graph is built on a
``tg.var`` size variable (the translator maps Dynamo's symbol onto it, as the importer maps
``torch.export``'s ``Dim``) and its two kernels serve every batch size.

:attr:`Backend.stats` counts compiled graphs, te_grad ops built, their forward calls and the
fallback nodes; :attr:`Backend.ops` holds the te_grad ops (``op.spec(...)`` gives a partition's
te_grad graph and kernels). ``te_grad.torch.backend`` is one ``te_grad.torch.Backend()``; make
another for separate counts and notes.
"""
from __future__ import annotations

import inspect
import itertools
import operator
import warnings
from collections import Counter
from contextlib import nullcontext
from typing import Dict, List, Optional

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from . import dsl, dtypes, sizes as tg_sizes
from .errors import UserError
from .ir import Tensor
from .frontends.aten import KEEP, RULES
from .frontends.translate import Translator, dtype_of, op_name, source_line

__all__ = ["Backend", "FallbackWarning", "decompositions"]

#: ops ``te_grad.torch.custom_op`` registers get unique names from this
_NAMES = itertools.count()


class FallbackWarning(UserWarning):
    """A node of a compiled graph runs in PyTorch rather than in a te_grad kernel."""


def decompositions() -> dict:
    """Core ATen decompositions less those of :data:`KEEP` (kept whole, a rule covers them)."""
    table = dict(torch._decomp.core_aten_decompositions())
    for name in KEEP:
        ns, op, overload = name.split(".")
        table.pop(getattr(getattr(getattr(torch.ops, ns), op), overload), None)
    return table


def _tensors(val) -> list:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _is_sym(n) -> bool:
    return isinstance(n, torch.SymInt) and not getattr(n.node.expr, "is_number", False)


def _refusal(node) -> Optional[str]:
    """Why te_grad does not take ``node`` in a compiled graph (``None``: it does), before translating."""
    val = node.meta.get("val")
    if node.target is operator.getitem:
        return None if isinstance(val, torch.Tensor) else "not a tensor"
    name = op_name(node)
    if name not in RULES:
        return "no te_grad rule"
    tensors = _tensors(val)
    if not tensors:
        return "not a tensor"
    for t in tensors + [a.meta.get("val") for a in node.all_input_nodes
                        if isinstance(a.meta.get("val"), torch.Tensor)]:
        if dtype_of(t.dtype) is None:
            return f"dtype {t.dtype} is not one te_grad takes"
    if name == "aten.native_dropout.default":
        p = node.args[1] if len(node.args) > 1 else 0.0
        train = node.args[2] if len(node.args) > 2 else True
        if train and p:
            return "dropout draws from PyTorch's generator here"
    return None


class _Support(OperatorSupportBase):
    def __init__(self, refused: Dict[object, str]):
        self.refused = refused

    def is_node_supported(self, submodules, node) -> bool:
        if node.op != "call_function" or node in self.refused:
            return False
        if node.target is operator.getitem:
            src = node.args[0]
            return src.op == "call_function" and src not in self.refused and _refusal(src) is None \
                and _refusal(node) is None
        return _refusal(node) is None


class _Refused(Exception):
    def __init__(self, node, reason: str):
        super().__init__(reason)
        self.node, self.reason = node, reason


def _size(t: Translator, val, user):
    """A ``SymInt`` input of a partition as a te_grad size, from the symbols its tensor inputs bound."""
    if not isinstance(val, torch.SymInt):
        return t.size(val)
    expr = val.node.expr
    missing = [s for s in expr.free_symbols if s not in t.symbols]
    if missing:
        raise _Refused(user, f"the size {expr} is not an extent of the te_grad op's tensor inputs")
    return t._sympy(expr)


def _translate(inputs, nodes, outputs) -> list:
    """The te_grad values of ``outputs``: ``inputs`` are ``(node, te_grad tensor or None)`` (None: a
    size, from its ``SymInt``), ``nodes`` the partition's nodes in order. A failing node raises
    :class:`_Refused` naming it."""
    t = Translator(RULES, None, where="te_grad backend")
    for node, value in inputs:
        if value is not None:
            t.bind_placeholder(node, value)
    members = set(nodes)
    for node, value in inputs:
        if value is None:  # a size refused is charged to its first reader inside the partition
            user = next((u for u in node.users if u in members), node)
            t.values[node.name] = _size(t, node.meta.get("val"), user)
    for node in nodes:
        if node.op != "call_function":
            continue
        try:
            t.values[node.name] = t.call(node)
        except _Refused:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of a rule: the node runs in PyTorch
            if getattr(e, "reason", None):  # a refusal by the Translator: the warning names node and line
                raise _Refused(node, f"the rule refused it: {e.reason}") from None
            inner = e.__context__ if isinstance(e, UserError) and e.__context__ is not None else e
            raise _Refused(node, f"the rule refused it: {type(inner).__name__}: {inner}") from None
    out = []
    for node in outputs:
        v = t.values.get(node.name)
        if not isinstance(v, Tensor):
            raise _Refused(node, "te_grad does not compute this result")
        if not dtypes.is_float(v.dtype):
            raise _Refused(node, f"a te_grad op's results are float tensors, this one is {v.dtype}")
        out.append(v)
    return out


def _placeholder(val, k: int, symbols: dict):
    shape = []
    for n in val.shape:
        if _is_sym(n):
            expr = n.node.expr
            key = str(expr) if getattr(expr, "is_Symbol", False) else f"{expr}_{k}"
            shape.append(symbols.setdefault(key, tg_sizes.var(f"s_{len(symbols)}")))
        else:
            shape.append(int(n))
    return dsl.placeholder(tuple(shape), dtype=dtype_of(val.dtype), name=f"x{k}")


def _partition_io(nodes, members):
    """The external nodes a partition reads (first use order) and its nodes read outside it."""
    inputs, seen = [], set()
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in members and a not in seen:
                seen.add(a)
                inputs.append(a)
    outputs = [n for n in nodes if any(u not in members for u in n.users)]
    return inputs, outputs


def _mutates(node) -> bool:
    """Whether Dynamo's ``node`` changes its first operand in place (``x.add_(..)``,
    ``torch.relu_``, ``inplace=True``, ``x[i] = ..``, ``out=``)."""
    if node.op not in ("call_method", "call_function"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name in ("setitem", "__setitem__") or \
        node.kwargs.get("inplace") is True or "out" in node.kwargs


def _no_grad_blocks(gm, enabled: bool):
    """``(nodes, switches)``: the nodes of ``gm`` inside its ``torch.no_grad()`` blocks, in order,
    and its ``_set_grad_enabled`` nodes (``enabled``: the grad mode the graph is compiled in)."""
    inside, switches = [], []
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "_set_grad_enabled" \
                and not node.users:
            enabled = bool(node.args[0])
            switches.append(node)
        elif not enabled and node.op in ("call_function", "call_method", "call_module"):
            inside.append(node)
    return inside, switches


def _no_grad_mutation(gm, enabled: bool):
    """The first node of a ``torch.no_grad()`` block of ``gm`` that changes in place a tensor made
    outside the block (a buffer's running average, a parameter, an activation), or None. Eager
    PyTorch records no gradient through such a change while later reads see the new value; the
    export's functional form would differentiate the new value, so such a graph runs in PyTorch."""
    seen = set()
    for node in _no_grad_blocks(gm, enabled)[0]:
        seen.add(node)
        target = node.args[0] if node.args else None
        if _mutates(node) and isinstance(target, torch.fx.Node) and target not in seen:
            return node
    return None


def _detach_no_grad_regions(gm, enabled: bool) -> int:
    """Each ``torch.no_grad()`` block of Dynamo's graph ``gm`` (:func:`_no_grad_blocks`) as
    ``detach`` of every result the block's nodes give to nodes after it, the mode switches
    erased. The export traced the graph under ``no_grad`` but the switch back on inside it made
    it trace a joint graph of ``primals`` and ``tangents`` (parameters taken as user inputs),
    which failed to compile or to run; detached, the values are the same and carry no gradient,
    as in PyTorch. Returns the count of results detached."""
    graph = gm.graph
    inside, switches = _no_grad_blocks(gm, enabled)
    if not switches:
        return 0
    members, cut = set(inside), 0
    for node in inside:
        later = [u for u in node.users if u not in members]
        if not later or not isinstance(node.meta.get("example_value", node.meta.get("val")), torch.Tensor):
            continue
        with graph.inserting_after(node):
            detached = graph.call_function(torch.Tensor.detach, (node,))
        detached.meta = dict(node.meta)
        for user in later:
            user.replace_input_with(node, detached)
        cut += 1
    for node in switches:
        graph.erase_node(node)
    gm.recompile()
    return cut


def _drop_metadata_asserts(g) -> int:
    """Erase ``g``'s ``_assert_tensor_metadata`` nodes (the export puts one after each dtype
    conversion, checking its operand's dtype, device and layout against the trace), as inductor
    does: the check read the operand, which made every conversion's operand a partition output,
    and an integer one (``(h > 0).int().sum(-1).double()``) then pushed the whole chain out of
    te_grad node by node. Returns the count erased."""
    target = getattr(torch.ops.aten, "_assert_tensor_metadata", None)
    target = getattr(target, "default", None)
    erased = 0
    for node in list(g.graph.nodes):
        if node.op == "call_function" and target is not None and node.target is target and not node.users:
            g.graph.erase_node(node)
            erased += 1
    if erased:
        g.recompile()
    return erased


class _TeGradCall(torch.nn.Module):
    """A partition in the compiled graph: the te_grad op on the partition's tensor inputs."""

    def __init__(self, op, tensor_positions: List[int], stats: Counter):
        super().__init__()
        self.op, self.tensor_positions, self.stats = op, tensor_positions, stats

    def forward(self, *args):
        out = self.op(*[args[i] for i in self.tensor_positions])
        self.stats["te_grad_calls"] += 1
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _op_fn(sub: torch.fx.GraphModule, tensor_placeholders, size_placeholders):
    """The te_grad function of a fused partition: its tensor inputs in, its outputs out."""
    nodes = list(sub.graph.nodes)
    out_node = nodes[-1]
    outputs = list(out_node.args[0]) if isinstance(out_node.args[0], (tuple, list)) else [out_node.args[0]]

    def fn(*xs):
        inputs = list(zip(tensor_placeholders, xs)) + [(n, None) for n in size_placeholders]
        try:
            return _translate(inputs, nodes, outputs)
        except _Refused as e:
            raise UserError(f"te_grad backend: {op_name(e.node)} ({source_line(e.node)}): {e.reason}") from None

    fn.__signature__ = inspect.Signature([inspect.Parameter(f"x{k}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                          for k in range(len(tensor_placeholders))])
    fn.__name__ = "partition"
    return fn


class _Compiled:
    """The function Dynamo calls: the partitioned ATen graph, then the buffer write-backs."""

    def __init__(self, gm, lifted, writes, n_mut, out_spec):
        self.gm, self.lifted, self.writes, self.n_mut, self.out_spec = gm, lifted, writes, n_mut, out_spec

    def __call__(self, *args):
        full = list(self.lifted) + list(args)
        given = list(full)
        for _, target in self.writes:  # the graph reads a copy: a te_grad op may save the old value
            full[target] = full[target].detach().clone()
        outs = self.gm(*full)
        if self.writes:
            with torch.no_grad():
                for k, target in self.writes:
                    given[target].copy_(outs[k])
        user = list(outs[self.n_mut:])
        return torch.utils._pytree.tree_unflatten(user, self.out_spec)


class Backend:
    """A ``torch.compile`` backend running supported subgraphs as te_grad ops (module docstring).

    :attr:`make_op` makes the te_grad ops (``te_grad.torch.custom_op``: ``te_grad.torch.Backend``
    sets it; this module does not import ``te_grad.torch``, which imports it)."""

    #: ``make_op(name, fn, dynamic_dims=...)``: a te_grad op as a PyTorch operator
    make_op = None

    def __init__(self):
        #: counts: ``graphs`` compiled, ``te_grad_ops`` built, ``te_grad_calls`` (forward calls of
        #: the te_grad ops), ``fallback_nodes`` (tensor nodes left to PyTorch, over all graphs),
        #: ``graphs_in_pytorch`` (graphs run wholly in PyTorch: an in-place change in a no_grad block)
        self.stats: Counter = Counter()
        #: the te_grad ops built, in order (:class:`te_grad.torch.TorchOp`)
        self.ops: list = []
        #: the fallback notes given, each once
        self.notes: List[str] = []
        self._noted: set = set()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        from torch._functorch.aot_autograd import aot_export_module
        from torch._guards import detect_fake_mode

        if self.make_op is None:
            raise UserError("te_grad backend: use te_grad.torch.backend (or te_grad.torch.Backend())")
        fake_mode = detect_fake_mode(example_inputs)
        mutation = _no_grad_mutation(gm, torch.is_grad_enabled())
        if mutation is not None:
            self.stats["graphs_in_pytorch"] += 1
            self._note(mutation, "a torch.no_grad() block changes a tensor made before it in place, which "
                                 "te_grad would differentiate: the whole graph runs in PyTorch")
            return gm.forward
        _detach_no_grad_regions(gm, torch.is_grad_enabled())
        # mkldnn off while tracing: a recurrent layer then decomposes into its cells instead of
        # the CPU's fused mkldnn_rnn_layer, which te_grad does not translate
        with (fake_mode if fake_mode is not None else nullcontext()), torch.backends.mkldnn.flags(enabled=False):
            g, sig = aot_export_module(gm, list(example_inputs), trace_joint=False,
                                       decompositions=decompositions())
        if sig.input_tokens or sig.output_tokens:
            raise UserError("te_grad backend: graphs with side-effect tokens are not supported")
        self.stats["graphs"] += 1
        placeholders = [n for n in g.graph.nodes if n.op == "placeholder"]
        lifted = [gm.get_parameter(n) for n in sig.parameters] + [gm.get_buffer(n) for n in sig.buffers]
        index = {n.name: k for k, n in enumerate(placeholders)}
        by_name = {**{v: k for k, v in sig.inputs_to_parameters.items()},
                   **{v: k for k, v in sig.inputs_to_buffers.items()}}
        mutations = {**sig.buffers_to_mutate, **getattr(sig, "parameters_to_mutate", {}),
                     **sig.user_inputs_to_mutate}
        outs = list(g.graph.output_node().args[0])
        n_mut = len(mutations)
        writes = []
        for k, node in enumerate(outs[:n_mut]):
            target = mutations[node.name]
            writes.append((k, index[by_name.get(target, target)]))

        _drop_metadata_asserts(g)
        refused = self._partition(g)
        for node in g.graph.nodes:
            if node.op == "call_function" and node.target is not operator.getitem and _tensors(node.meta.get("val")):
                why = refused.get(node) or _refusal(node)
                if why is not None:
                    self._note(node, why)
        self._fuse(g)
        return _Compiled(g, lifted, writes, n_mut, sig.out_spec)

    # -- steps ---------------------------------------------------------------------------------
    def _partition(self, g) -> Dict[object, str]:
        """The nodes refused on translation (node -> reason), the partitions all translating."""
        refused: Dict[object, str] = {}
        order = {n: k for k, n in enumerate(g.graph.nodes)}
        while True:
            parts = CapabilityBasedPartitioner(g, _Support(refused), allows_single_node_partition=True) \
                .propose_partitions()
            again = False
            for p in parts:
                members = set(p.nodes)
                nodes = sorted(members, key=order.__getitem__)
                inputs, outputs = _partition_io(nodes, members)
                symbols: dict = {}
                values = []
                for k, a in enumerate(inputs):
                    val = a.meta.get("val")
                    values.append((a, _placeholder(val, k, symbols) if isinstance(val, torch.Tensor) else None))
                try:
                    _translate(values, nodes, outputs)
                except _Refused as e:
                    at = e.node
                    if at.target is operator.getitem:
                        # a result the rule does not give (pooling's indices, read): its operator
                        # runs in PyTorch (a getitem follows its operator into or out of a
                        # partition: refused itself, it would never leave one, and the
                        # partitioning would not end)
                        at = at.args[0]
                    refused[at if at in members else next(u for u in at.users if u in members)] = e.reason
                    again = True
            if not again:
                self._parts = parts
                return refused

    def _fuse(self, g) -> int:
        parts = [p for p in self._parts
                 if any(isinstance(a.meta.get("val"), torch.Tensor)
                        for a in _partition_io(list(p.nodes), set(p.nodes))[0])]
        if not parts:
            return 0
        fuse_by_partitions(g, [dict.fromkeys(p.nodes) for p in parts], prefix="te_grad_", always_return_tuple=True)
        made = 0
        for node in list(g.graph.nodes):
            if node.op != "call_module" or not str(node.target).startswith("te_grad_"):
                continue
            sub = getattr(g, node.target)
            phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
            positions = [k for k, n in enumerate(phs) if isinstance(n.meta.get("val"), torch.Tensor)]
            tensor_phs = [phs[k] for k in positions]
            sizes = [n for n in phs if not isinstance(n.meta.get("val"), torch.Tensor)]
            dynamic = {f"x{k}": tuple(d for d, n in enumerate(p.meta["val"].shape) if _is_sym(n))
                       for k, p in enumerate(tensor_phs)}
            dynamic = {k: v for k, v in dynamic.items() if v}
            op = self.make_op(f"te_grad_dynamo::partition{next(_NAMES)}", _op_fn(sub, tensor_phs, sizes),
                           dynamic_dims=dynamic or None)
            setattr(g, node.target, _TeGradCall(op, positions, self.stats))
            self.ops.append(op)
            self.stats["te_grad_ops"] += 1
            made += 1
        g.recompile()
        return made

    def _note(self, node, why: str):
        self.stats["fallback_nodes"] += 1
        where = source_line(node)
        key = (op_name(node), where, why)
        if key in self._noted:
            return
        self._noted.add(key)
        msg = f"te_grad backend: {op_name(node)}" + (f" at {where}" if where else f" (node {node.name})") + \
            f" runs in PyTorch ({why})"
        self.notes.append(msg)
        warnings.warn(msg, FallbackWarning, stacklevel=2)
