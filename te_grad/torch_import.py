"""Importing a ``torch.nn.Module``: ``torch.export``, then the ATen graph as te_grad tensors.

::

    import te_grad.torch as tgt
    from te_grad import train

    model = tgt.import_model(net, (x_example,))          # net: any torch.nn.Module
    x, y = model.input_placeholders()[0], tg.placeholder((32,), "int64", name="y")
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.SGD(lr=0.1))
    trainer.update(xb, yb)                              # one native call: forward, backward, update
    model.copy_to(net, trainer)                         # the trained weights back into PyTorch

:func:`import_model` exports the module twice with ``torch.export`` (once in training mode,
once in evaluation mode, restoring the module's mode after), decomposes both programs to
PyTorch's core ATen opset (keeping :data:`te_grad.frontends.aten.KEEP` whole), and checks
that te_grad translates every operator: an unsupported one is a :class:`UserError` listing
each with its model source line, before anything is built.

The result is an :class:`ImportedModel`, a :class:`te_grad.train.Module`:

- its parameters (:class:`~te_grad.train.Param`) are the module's parameters that require a
  gradient, named as in ``state_dict`` and starting from the module's current values (the
  Trainer's initializer does not touch them). A parameter shared by several modules (a
  language model's head tied to its token embedding) is one parameter, named by its first
  name in ``named_parameters`` (``ImportedModel.aliases`` maps every name to it), and its
  gradient is the sum over its uses, as in PyTorch;
- its states (:class:`~te_grad.train.State`) are the module's buffers (batch norm's running
  statistics and ``num_batches_tracked``), parameters that do not require a gradient (frozen:
  read, never updated) and tensor constants. Each program reads its own constants: both
  number the tensors made in ``forward`` from ``lifted_tensor_0``, so a name the evaluation
  program shares with other values gets a state of its own (``lifted_tensor_0.eval``). A
  buffer the training program mutates is updated by the training step exactly as PyTorch
  updates it (the program's own ``BUFFER_MUTATION`` outputs);
- calling it with a :class:`~te_grad.train.Context` translates the training program when
  ``ctx.training`` and the evaluation program otherwise (batch norm on running statistics,
  dropout the identity). Dropout in training draws its mask from the step's seed.

With ``dynamic_batch`` (the default) dimension 0 of every input is a ``torch.export.Dim``;
translated on the Trainer's ``batch`` size variable, one step kernel serves every batch size.
A model whose export specializes the batch (its code depends on the value) is exported with
the example's shape instead, and :attr:`ImportedModel.static_reason` says why.
"""
from __future__ import annotations

import inspect
import operator
import warnings
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from . import dsl
from .collector import during_build
from .errors import UserError
from .ir import Tensor
from .train.layers import Context, Module, Param, State
from .frontends.aten import KEEP, RULES
from .frontends.translate import SIZE_FUNCTIONS, check_supported, dtype_of, op_name, translate, unsupported

__all__ = ["import_model", "ImportedModel", "export_program", "coverage"]


def _decompositions():
    table = torch.export.default_decompositions()
    for name in KEEP:
        ns, op, overload = name.split(".")
        table.pop(getattr(getattr(getattr(torch.ops, ns), op), overload), None)
    return table


def _dynamic_shapes(module, example_inputs, dynamic_batch: bool):
    """``torch.export``'s ``dynamic_shapes`` for a batch along dimension 0 of every input tensor,
    laid out as ``module.forward``'s parameters take the inputs: one entry per positional
    parameter, and the inputs gathered by a ``*args`` parameter as one tuple there (export
    matches the structure to the signature: a flat tuple against ``forward(self, *xs)`` is
    refused, and the batch was then silently exact)."""
    if not dynamic_batch:
        return None
    batch = torch.export.Dim("batch")
    specs = [{0: batch} if isinstance(x, torch.Tensor) and x.ndim > 0 else None for x in example_inputs]
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # no signature to read: the flat layout
        return tuple(specs)
    for k, p in enumerate(params):
        if p.kind == p.VAR_POSITIONAL:   # (export wants no entry for an empty *args)
            return tuple(specs[:k]) + ((tuple(specs[k:]),) if len(specs) > k else ())
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
    return tuple(specs)


@during_build
def export_program(module: torch.nn.Module, example_inputs: Sequence, training: bool, dynamic_batch: bool = True):
    """``module`` exported in training or evaluation mode, decomposed to core ATen; the module's
    mode is restored. Returns ``(program, reason)``: ``reason`` says why the batch is not
    dynamic when ``dynamic_batch`` was asked for and the export had to specialize it."""
    was = module.training
    module.train(training)
    reason = None
    try:
        args = tuple(example_inputs)
        try:
            ep = torch.export.export(module, args, dynamic_shapes=_dynamic_shapes(module, args, dynamic_batch),
                                     strict=False)
        except Exception as e:  # noqa: BLE001 - a batch the program specializes: exact shapes
            if not dynamic_batch:
                raise UserError(f"import_model: torch.export failed: {type(e).__name__}: {e}") from e
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            try:
                ep = torch.export.export(module, args, strict=False)
            except Exception as e2:  # noqa: BLE001
                raise UserError(f"import_model: torch.export failed: {type(e2).__name__}: {e2}") from e2
        _detach_no_grad_regions(ep)
        ep = ep.run_decompositions(_decompositions())
    finally:
        module.train(was)
    return ep, reason


def _detach_no_grad_regions(ep) -> None:
    """Every result of a ``torch.no_grad()`` (``set_grad_enabled(False)``) block of ``ep``
    detached, in place: ``torch.export`` keeps such a block as one higher-order node, which
    the decomposition inlines, and with it the fact that its results carry no gradient."""
    graph = ep.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or getattr(node.target, "__name__", "") != "wrap_with_set_grad_enabled" \
                or node.args[0] is not False:
            continue
        for user in list(node.users):  # the block's results, each taken out by a getitem
            with graph.inserting_after(user):
                cut = graph.call_function(torch.ops.aten.detach.default, (user,))
            cut.meta = dict(user.meta)
            user.replace_all_uses_with(cut, delete_user_cb=lambda u, cut=cut: u is not cut)
            changed = True
    if changed:
        ep.graph_module.recompile()


#: core ATen operators whose result PyTorch's autograd does not connect to their tensor operands
#: (the result of ``detach``, and a tensor made only in the shape of another)
_NOT_DIFFERENTIABLE = frozenset(f"aten.{op}.default" for op in (
    "detach", "full_like", "empty_like", "zeros_like", "ones_like", "rand_like", "randn_like", "randint_like",
    "new_full", "new_empty", "new_zeros", "new_ones", "new_empty_strided"))


#: operators returning several tensors each of which depends on every operand (pieces of one
#: tensor, ``var_mean``'s two statistics of one tensor); of any other operator's results only
#: the first does (``native_layer_norm``'s mean and rstd, batch norm's new running statistics
#: and ``max.dim``'s indices are not connected to the weights; ``native_group_norm``'s
#: statistics are, to its input only, which the walk cannot tell from its weight)
_EVERY_RESULT = frozenset(("aten.split_with_sizes.default", "aten.split.Tensor", "aten.unbind.int",
                           "aten.chunk.default", "aten.tensor_split.sections", "aten.unsafe_split.Tensor",
                           "aten.split_with_sizes_copy.default", "aten.unbind_copy.int",
                           "aten.var_mean.correction"))


def _floating(value) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_floating(v) for v in value)
    return isinstance(value, torch.Tensor) and (value.dtype.is_floating_point or value.dtype.is_complex)


def gradient_reach(ep, aliases: Dict[str, str]) -> List[frozenset]:
    """For each user output of the training program ``ep``, the parameters (by their kept
    names, ``aliases`` applied) whose ``grad`` PyTorch's autograd sets when a loss of that output
    is differentiated: those with a path to it through operators that connect their result to
    their operands. A result connects when it is floating point and its operator differentiable:
    a comparison, an integer result, ``.item()``, ``detach``, ``zeros_like`` cut the path, while
    ``0 * p`` does not (PyTorch's ``grad`` of ``p`` is zeros, which weight decay still moves,
    where te_grad derives the constant 0). Of an operator's several results only the first
    carries the path on (:data:`_EVERY_RESULT` excepted). The sets may miss a path (the Trainer
    then keeps te_grad's rule, a constant-0 gradient moves nothing); they must not add one."""
    reach: Dict[str, frozenset] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "PARAMETER":
            reach[spec.arg.name] = frozenset([aliases.get(spec.target, spec.target)])
    outputs = []
    for node in ep.graph.nodes:
        if node.op == "output":
            outputs = list(node.args[0])
        if node.op != "call_function" or op_name(node) in _NOT_DIFFERENTIABLE \
                or not _floating(node.meta.get("val")):
            continue
        if node.target is operator.getitem and node.args[1] != 0 and op_name(node.args[0]) not in _EVERY_RESULT:
            continue  # a by-product of the operator (statistics, indices): reached by no parameter
        found = frozenset().union(*[reach.get(a.name, frozenset()) for a in node.all_input_nodes])
        if found:
            reach[node.name] = found
    return [reach.get(getattr(v, "name", None), frozenset())
            for spec, v in zip(ep.graph_signature.output_specs, outputs) if spec.kind.name == "USER_OUTPUT"]


def _check_modules(module: torch.nn.Module, name: str) -> None:
    """A :class:`UserError` naming every submodule whose training step ``torch.export`` cannot
    capture faithfully: batch norm with ``momentum=None`` (a cumulative average, whose factor
    ``1 / num_batches_tracked`` PyTorch computes as a Python float from the buffer's value)."""
    bad = [sub or "(the module itself)" for sub, m in module.named_modules()
           if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.momentum is None
           and m.track_running_stats]
    if bad:
        raise UserError(f"import_model({name}): batch norm with momentum=None (a cumulative moving average, "
                        f"its factor 1/num_batches_tracked read as a Python number) is not imported: "
                        f"{', '.join(bad)}; give these a float momentum")


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy().copy()


class ImportedModel(Module):
    """A ``torch.nn.Module`` as a :class:`te_grad.train.Module` (see the module docstring)."""

    #: why a model with a dynamic batch takes batches of 2 on (:attr:`min_batch`)
    min_batch_reason = ("imported with a dynamic batch, which torch.export traces for batches of at "
                        "least 2; import with dynamic_batch=False and an example batch of 1 for those")

    @property
    def min_batch(self) -> int:
        """The least batch the programs hold for: torch.export traces a dynamic batch for 2 on
        (code may treat a batch of 1 otherwise: ``squeeze()``, broadcasting)."""
        return 2 if self.dynamic_batch else 1

    @during_build
    def __init__(self, module: torch.nn.Module, example_inputs: Sequence, dynamic_batch: bool = True):
        if not isinstance(module, torch.nn.Module):
            raise UserError(f"import_model: expected a torch.nn.Module, got {type(module).__name__}")
        example_inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
        for k, x in enumerate(example_inputs):
            if not isinstance(x, torch.Tensor):
                raise UserError(f"import_model: example input {k} is a {type(x).__name__}, not a torch.Tensor")
            if dtype_of(x.dtype) is None:
                raise UserError(f"import_model: example input {k} has dtype {x.dtype}, which te_grad does not take")
            if dynamic_batch and x.ndim > 0 and x.shape[0] < 2:
                raise UserError(f"import_model: example input {k} has batch {x.shape[0]}; torch.export "
                                "specializes a batch of 0 or 1, give an example batch of at least 2 "
                                "(or dynamic_batch=False)")
        self.module_name = type(module).__name__
        _check_modules(module, self.module_name)
        self.example_shapes = [tuple(x.shape) for x in example_inputs]
        self.example_dtypes = [dtype_of(x.dtype) for x in example_inputs]
        self.num_inputs = len(example_inputs)
        self.programs = {}
        reasons = []
        for training in (True, False):
            ep, reason = export_program(module, example_inputs, training, dynamic_batch)
            self.programs[training] = ep
            if reason:
                reasons.append(reason)
        #: why the batch is not a size variable although ``dynamic_batch`` was asked for
        self.static_reason: Optional[str] = reasons[0] if reasons else None
        self.dynamic_batch = dynamic_batch and self.static_reason is None
        if self.static_reason:
            warnings.warn(f"import_model: the batch of {self.module_name} is exact ({self.static_reason})",
                          RuntimeWarning, stacklevel=3)
        missing = []
        for training, ep in self.programs.items():
            missing += [m for m in unsupported(ep.graph.nodes, RULES) if m not in missing]
        if missing:
            check_supported([n for ep in self.programs.values() for n in ep.graph.nodes], RULES,
                            f"import_model({self.module_name})")
        named = dict(module.named_parameters(remove_duplicate=False))
        buffers = dict(module.named_buffers(remove_duplicate=False))
        #: each name of a shared (tied) parameter or buffer -> its first name, the one te_grad keeps
        self.aliases: Dict[str, str] = _aliases(list(module.named_parameters(remove_duplicate=False)) +
                                                list(module.named_buffers(remove_duplicate=False)))
        #: per user output of the training program, the parameters whose gradient PyTorch sets
        self.gradient_reach = gradient_reach(self.programs[True], self.aliases)
        self._params: Dict[str, Param] = {}
        self._states: Dict[str, State] = {}
        #: (training, a program's constant) -> the state holding it: the two programs number their
        #: lifted constants each from 0, so one name may hold different values in the two modes
        self._constant_names: Dict[tuple, str] = {}
        for training, ep in self.programs.items():
            sig = ep.graph_signature
            for spec in sig.input_specs:
                kind = spec.kind.name
                target = self.aliases.get(spec.target, spec.target)
                if kind == "PARAMETER":
                    p = named[target]
                    if p.requires_grad:
                        self._param(target, p)
                    else:
                        self._state(target, p)
                elif kind == "BUFFER":
                    self._state(target, buffers[target])
                elif kind == "CONSTANT_TENSOR":
                    self._constant(training, target, ep.constants[target])
                elif kind not in ("USER_INPUT",):
                    raise UserError(f"import_model: program input {spec.arg.name} of kind {kind} is not supported")
        refused = self._refusals()
        if refused:
            raise UserError(f"import_model({self.module_name}): {len(refused)} use(s) of ATen operators te_grad "
                            "translates but not as written here:\n  " + "\n  ".join(refused))

    def _refusals(self) -> List[str]:
        """Every use of an operator whose rule refuses it as written, in either mode (a trial
        translation on placeholders of the example shapes: the exact shapes a Trainer falls back
        to when a step cannot be built on a batch size variable, so what is refused here is
        refused at every batch)."""
        found: List[str] = []
        for training in (True, False):
            xs = self.input_placeholders()
            self._translate(xs, Context(training=training, seed=dsl.placeholder((), dtype="int64", name="seed")),
                            found)
        return list(dict.fromkeys(found))

    def _param(self, name, value: torch.Tensor):
        if name in self._params:
            return
        dtype = dtype_of(value.dtype)
        if dtype is None or not dtype.startswith("float"):
            raise UserError(f"import_model: parameter {name} has dtype {value.dtype}; trainable parameters "
                            "must be float32 or float64")
        shape = tuple(value.shape)
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        p = Param(name, shape, "weight" if len(shape) > 1 else "bias", fan_in, shape[0] if shape else 1, dtype)
        p.value = _numpy(value)
        self._params[name] = p

    def _constant(self, training: bool, target: str, value: torch.Tensor):
        """The state of a program's lifted constant: the other mode's state of that name when it
        holds the same value, else one of its own (the name suffixed by the mode)."""
        name = target
        held = self._states.get(name)
        if held is not None:
            same = held.shape == tuple(value.shape) and held.dtype == dtype_of(value.dtype) and \
                np.array_equal(held.initial, _numpy(value), equal_nan=value.dtype.is_floating_point)
            if not same:
                name = f"{target}.{'train' if training else 'eval'}"
                while name in self._states or name in self._params:
                    name += "_"
        self._state(name, value)
        self._constant_names[(training, target)] = name

    def _state(self, name, value: torch.Tensor):
        if name in self._states:
            return
        dtype = dtype_of(value.dtype)
        if dtype is None:
            raise UserError(f"import_model: buffer {name} has dtype {value.dtype}, which te_grad does not take")
        self._states[name] = State(name, tuple(value.shape), _numpy(value), dtype)

    # -- the te_grad Module interface --------------------------------------------------------
    def parameters(self) -> List[Param]:
        return list(self._params.values())

    def states(self) -> List[State]:
        return list(self._states.values())

    def rename(self, prefix: str):
        raise UserError("an imported model keeps its PyTorch names; it cannot be put inside a Sequential")

    def params_with_gradient(self, outputs: Sequence[int]) -> set:
        """The parameters whose ``grad`` PyTorch sets from a loss of the training outputs at
        positions ``outputs`` (:func:`gradient_reach`)."""
        return set().union(*[self.gradient_reach[k] for k in outputs])

    def __call__(self, *args):
        return self.forward(*args)

    def forward(self, *args):
        """``forward(x0, ..., ctx)``: the program of ``ctx``'s mode on te_grad tensors ``x0, ...``."""
        if not args or not isinstance(args[-1], Context):
            raise UserError("an imported model is called as model(*inputs, ctx) with a train.Context")
        *xs, ctx = args
        if len(xs) != self.num_inputs:
            raise UserError(f"{self.module_name} takes {self.num_inputs} input(s), got {len(xs)}")
        return self._translate(xs, ctx)

    def _translate(self, xs, ctx, refusals: Optional[List[str]] = None):
        ep = self.programs[bool(ctx.training)]
        sig = ep.graph_signature
        inputs = {}
        user = iter(xs)
        for spec in sig.input_specs:
            kind, name = spec.kind.name, spec.arg.name
            if kind == "PARAMETER":
                target = self.aliases.get(spec.target, spec.target)
                holder = self._params.get(target) or self._states[target]
                inputs[name] = holder.placeholder
            elif kind == "BUFFER":
                inputs[name] = self._states[self.aliases.get(spec.target, spec.target)].placeholder
            elif kind == "CONSTANT_TENSOR":
                inputs[name] = self._states[self._constant_names[(bool(ctx.training), spec.target)]].placeholder
            else:
                x = next(user)
                if not isinstance(x, Tensor):
                    raise UserError(f"{self.module_name}: input {name} must be a te_grad tensor, got {x!r}")
                inputs[name] = x
        outs = translate(ep.graph.nodes, inputs, RULES, ctx, where=f"import_model({self.module_name})",
                         refusals=refusals)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        results = []
        for spec, value in zip(sig.output_specs, outs):
            kind = spec.kind.name
            if kind == "BUFFER_MUTATION":
                state = self._states[self.aliases.get(spec.target, spec.target)]
                ctx.updates[id(state.placeholder)] = value
            elif kind == "USER_OUTPUT":
                results.append(value)
            else:
                raise UserError(f"{self.module_name}: program output of kind {kind} is not supported")
        return results[0] if len(results) == 1 else tuple(results)

    # -- conveniences --------------------------------------------------------------------------
    def input_placeholders(self, names: Sequence[str] = None) -> List[Tensor]:
        """Placeholders of the example inputs' shapes and dtypes (the Trainer's ``inputs``)."""
        names = names or [f"x{k}" if self.num_inputs > 1 else "x" for k in range(self.num_inputs)]
        return [dsl.placeholder(s, dtype=d, name=n) for s, d, n in zip(self.example_shapes, self.example_dtypes,
                                                                        names)]

    def copy_to(self, module: torch.nn.Module, trainer) -> None:
        """Load ``trainer``'s current parameters and states into ``module`` (by ``state_dict`` name,
        and buffers registered with ``persistent=False`` by their names in ``named_buffers``)."""
        values = dict(trainer.params)
        values.update({k: v for k, v in trainer.states.items() if k in self._states})
        own = module.state_dict()
        update = {k: torch.from_numpy(np.array(v)).to(own[k].dtype) for k, v in values.items() if k in own}
        module.load_state_dict(update, strict=False)
        with torch.no_grad():  # buffers registered with persistent=False are not in the state_dict
            for k, buf in module.named_buffers(remove_duplicate=False):
                k = self.aliases.get(k, k)
                if k in values and k not in own and buf is not None:
                    buf.copy_(torch.from_numpy(np.array(values[k])).to(buf.dtype))


def _aliases(named) -> Dict[str, str]:
    """Every name of ``named`` (``(name, tensor)`` pairs) -> the first name of the same tensor."""
    first: Dict[int, str] = {}
    out = {}
    for name, value in named:
        out[name] = first.setdefault(id(value), name)
    return out


def import_model(module: torch.nn.Module, example_inputs, dynamic_batch: bool = True) -> ImportedModel:
    """``module`` as a te_grad training model (:class:`ImportedModel`, see the module docstring)."""
    return ImportedModel(module, example_inputs, dynamic_batch=dynamic_batch)


def coverage(module: torch.nn.Module, example_inputs, dynamic_batch: bool = True) -> List[tuple]:
    """``[(operator, count, translated)]`` over both programs of ``module``, most frequent first."""
    counts: Dict[str, int] = {}
    for training in (True, False):
        ep, _ = export_program(module, example_inputs, training, dynamic_batch)
        for node in ep.graph.nodes:
            if node.op == "call_function":
                name = op_name(node)
                counts[name] = counts.get(name, 0) + 1
    python = {"getitem"} | {f.__name__ for f in SIZE_FUNCTIONS}  # what the translator does itself
    return sorted(((n, c, n in RULES or n in python)
                   for n, c in counts.items()), key=lambda r: (-r[1], r[0]))
