"""The Trainer: a whole training step (forward, loss, backward, optimizer update) as one kernel.

::

    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.Adam(lr=1e-3), init=train.xavier_uniform(seed=0))
    loss = trainer.update(xb, yb)          # one native call
    logits = trainer.predict(x_test)       # the forward kernel alone (batch norm in inference mode)

The step kernel's inputs are the batch, the step's hyperparameters (learning rate, step
count, dropout seed), the parameters and every state (optimizer moments, batch norm's
running statistics); its outputs are the loss, the accuracy (for a classifier), the new
parameters and the new states. The trainer owns two sets of buffers for parameters and
states and the kernel reads one and writes the other, alternating: nothing is copied
between steps and no buffer is read and written by one call.

The batch dimension is a size variable (``tg.var("batch", min=1)``): one step kernel serves
every batch size, the ragged last batch of an epoch included, with the sizes bound at each
call (``dynamic_batch=True``, the default). ``dynamic_batch=False`` builds an exact kernel
per batch size instead (each built on first use), as does a model that cannot be built on
a size variable (its step then falls back to exact kernels, and ``static_reason`` says why).
Every :mod:`te_grad.nn` op and layer takes a symbolic batch (``Flatten`` and ``reshape``
included), so the example models (the digits CNN, MLPs) train with one kernel;
:meth:`Trainer.predict` likewise runs one forward kernel for every batch size.

Options: ``clip_norm`` scales the gradients when their global norm exceeds it
(``torch.nn.utils.clip_grad_norm_``); ``accumulate=k`` sums the gradients of ``k``
consecutive batches and updates every ``k``-th call with their mean (two kernels: one
accumulates, one also updates).
"""
from __future__ import annotations

import numbers
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import dsl, dtypes, nn, sizes
from ..collector import during_build
from ..errors import UserError
from ..ir import Const, Tensor
from .init import Initializer, xavier_uniform
from .layers import Context, Module, Param
from .optim import Hyper, Optimizer, check_hyper


@dataclass
class _Slot:
    """A buffer the trainer owns: a parameter or a state, with its two alternating arrays."""
    name: str
    placeholder: Tensor
    arrays: Tuple[np.ndarray, np.ndarray]


class _Step:
    """One compiled step kernel and the order of its arguments."""

    def __init__(self, kernel, batch, n_out_extra, slot_inputs, slot_outputs, apply):
        self.kernel = kernel
        self.symbolic = bool(getattr(kernel, "size_vars", ()))  # one kernel for every batch size
        self.batch = batch                  # the batch placeholders, in call order
        self.n_out_extra = n_out_extra      # loss (and accuracy) outputs before the slots
        self.slot_inputs = slot_inputs      # slot indices read
        self.slot_outputs = slot_outputs    # slot indices written
        self.apply = apply                  # whether this kernel updates the parameters


def _fans(shape) -> Tuple[int, int]:
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _derived_zero(g) -> bool:
    """Whether ``g`` is a gradient derived as the constant 0: nothing differentiable reads the
    parameter (every read of it under ``stop_gradient``, a ``detach``)."""
    body = getattr(getattr(g, "op", None), "body", None)
    return isinstance(body, Const) and body.value == 0


def _as_params(params) -> List[Param]:
    """User placeholders as parameters (kind from rank: vectors are biases, the rest weights)."""
    out = []
    for p in params:
        if isinstance(p, Param):
            out.append(p)
            continue
        if not isinstance(p, Tensor) or not p.is_placeholder or not dtypes.is_float(p.dtype):
            raise UserError(f"Trainer: params must be float placeholders or train.Param, got {p!r}")
        fan_in, fan_out = _fans(p.shape)
        param = Param.__new__(Param)
        param.name, param.shape, param.dtype = p.name, p.shape, p.dtype
        param.kind = "bias" if p.ndim <= 1 else "weight"
        param.fan_in, param.fan_out, param.placeholder = fan_in, fan_out, p
        out.append(param)
    return out


class Trainer:
    """Trains ``model`` on batches (see the module docstring).

    ``model``: a :class:`~te_grad.train.Module` (called on the first input), or a function
    of the input placeholders returning the output tensor, with ``params`` listing its
    parameter placeholders. ``loss(output, *targets)`` returns a 0-d tensor. A model may
    return a tuple of tensors: ``loss`` then receives the tuple, and :meth:`predict` returns
    one array per output.

    A parameter the training loss does not read (an evaluation-only branch, an unused head)
    or reads only under ``stop_gradient`` (its gradient is derived as the constant 0) is left
    as it is by every step, weight decay and momentum included, as PyTorch's optimizers leave a
    parameter whose ``grad`` is ``None``. A model may name the parameters its own framework
    gives a gradient (:meth:`Module.params_with_gradient`): those move even where te_grad
    derives the constant 0, so an imported ``0 * p.sum()`` decays ``p`` as in PyTorch.
    """

    def __init__(self, model, inputs: Sequence[Tensor], targets: Sequence[Tensor], loss: Callable,
                 optimizer: Optimizer, init: Optional[Initializer] = None, params=None,
                 clip_norm: Optional[float] = None, accumulate: int = 1, threads: Optional[int] = None,
                 progress: bool = True, dynamic_batch: bool = True):
        self.model = model
        if not isinstance(dynamic_batch, bool):
            raise UserError(f"Trainer: dynamic_batch must be True or False, got {dynamic_batch!r}")
        #: whether the batch dimension is a size variable (one kernel for every batch size)
        self.dynamic_batch = dynamic_batch
        #: why the step kernels are built per batch size although dynamic_batch is set
        self.static_reason: Optional[str] = None
        self._batch_var = sizes.var("batch", min=1)
        self.inputs, self.targets = list(inputs), list(targets)
        self.loss_fn, self.optimizer = loss, optimizer
        self.clip_norm = None if clip_norm is None else check_hyper("Trainer", "clip_norm", clip_norm,
                                                                    low_open=True)
        if not isinstance(accumulate, int) or accumulate < 1:
            raise UserError(f"Trainer: accumulate must be a positive int, got {accumulate!r}")
        self.accumulate = accumulate
        self.threads = threads
        self.progress = progress
        if isinstance(model, Module):
            n_inputs = getattr(model, "num_inputs", 1)
            if len(self.inputs) != n_inputs:
                raise UserError(f"Trainer: the model takes {n_inputs} input(s), got {len(self.inputs)} "
                                "(pass a function of the inputs for several)")
            self._param_list = model.parameters()
            model_states = model.states()
        else:
            if params is None:
                raise UserError("Trainer: a model given as a function needs params=[its parameter placeholders]")
            self._param_list = _as_params(params)
            model_states = []
        if not self._param_list:
            raise UserError("Trainer: the model has no parameters")
        names = [p.name for p in self._param_list]
        if len(set(names)) != len(names):
            raise UserError(f"Trainer: parameter names repeat: {names}")
        init = init if init is not None else xavier_uniform(seed=0)
        values = init([p for p in self._param_list if getattr(p, "value", None) is None])
        values.update({p.name: p.value for p in self._param_list if getattr(p, "value", None) is not None})
        self._slots: List[_Slot] = []
        self._index: Dict[str, int] = {}
        for p in self._param_list:
            self._add(p.name, p.placeholder, values[p.name])
        self._model_states = list(model_states)
        for s in model_states:
            self._add(s.name, s.placeholder, np.broadcast_to(np.asarray(s.initial, dtype=s.dtype), s.shape).copy())
        self._opt_states: Dict[str, List[int]] = {}
        for p in self._param_list:
            ids = []
            for suffix, initial in optimizer.states():
                name = f"{p.name}.{suffix}"
                ids.append(self._add(name, dsl.placeholder(p.shape, dtype=p.dtype, name=name),
                                     np.full(p.shape, initial, dtype=p.dtype)))
            self._opt_states[p.name] = ids
        self._acc: Dict[str, int] = {}
        if accumulate > 1:
            for p in self._param_list:
                name = f"{p.name}.grad_sum"
                self._acc[p.name] = self._add(name, dsl.placeholder(p.shape, dtype=p.dtype, name=name),
                                              np.zeros(p.shape, dtype=p.dtype))
        self._current = 0
        self.t = 0                          # optimizer steps taken
        self._calls = 0                     # batches seen (accumulation counts these)
        self._seed = 0
        self._steps: Dict[tuple, _Step] = {}
        self._predict: Dict[tuple, object] = {}
        #: why :meth:`predict` builds a kernel per batch shape although dynamic_batch is set
        self._predict_static_reason: Optional[str] = None
        self.last = {}                      # the last step's loss (and accuracy)
        self._scalars = {"lr": np.zeros((), np.float32), "t": np.zeros((), np.float32),
                         "seed": np.zeros((), np.int64)}

    def _add(self, name, placeholder, value) -> int:
        value = np.array(value, dtype=placeholder.dtype, order="C")  # (ascontiguousarray makes a 0-d array 1-d)
        if value.shape != placeholder.shape:
            raise UserError(f"Trainer: initial value of {name} has shape {value.shape}, expected {placeholder.shape}")
        self._index[name] = len(self._slots)
        self._slots.append(_Slot(name, placeholder, (value, np.empty_like(value))))
        return len(self._slots) - 1

    # -- graphs --------------------------------------------------------------------------------
    def _batch_placeholders(self, shapes):
        given = tuple(t.shape for t in self.inputs + self.targets)
        if len(shapes) == len(given) and all(sizes.same_shape(a, b) for a, b in zip(shapes, given)):
            return self.inputs, self.targets
        xs = [dsl.placeholder(s, dtype=t.dtype, name=t.name) for t, s in zip(self.inputs, shapes)]
        ys = [dsl.placeholder(s, dtype=t.dtype, name=t.name) for t, s in zip(self.targets, shapes[len(xs):])]
        return xs, ys

    def _params_with_gradient(self, out, adjoints) -> Optional[set]:
        """:meth:`Module.params_with_gradient` of the model for the outputs the loss reads
        differentiably: those with an adjoint (an output read only under ``stop_gradient``, a
        comparison or an index has none, as PyTorch's ``detach`` gives it no gradient)."""
        if not isinstance(self.model, Module):
            return None
        used = {id(t) for t in adjoints}
        outs = out if isinstance(out, (tuple, list)) else [out]
        return self.model.params_with_gradient([k for k, o in enumerate(outs) if id(o) in used])

    def _forward(self, xs, ctx):
        if isinstance(self.model, Module):
            return self.model(*xs, ctx)
        return self.model(*xs)

    def _accuracy(self, out, ys):
        if len(ys) != 1 or not isinstance(out, Tensor) or out.ndim != 2 or not dtypes.is_int(ys[0].dtype) or \
                not sizes.same_shape(ys[0].shape, out.shape[:1]):
            return None
        y = ys[0]
        n, c = out.shape
        k = dsl.reduce_axis((0, c), "k")
        best = dsl.compute((n,), lambda i: dsl.max(out[i, k], axis=k), name="accuracy_max")
        r = dsl.reduce_axis((0, n), "r")  # n may be the batch size variable
        return dsl.compute((), lambda: dsl.sum(dsl.if_then_else(out[r, y[r]] >= best[r], 1.0, 0.0), axis=r)
                           * (1.0 / n), name="accuracy")

    @during_build
    def _build_step(self, shapes, apply: bool, wait: bool = True, carry: bool = False) -> _Step:
        from .. import build, differentiate
        xs, ys = self._batch_placeholders(shapes)
        seed = dsl.placeholder((), dtype="int64", name="seed")
        lr = dsl.placeholder((), dtype="float32", name="lr")
        t = dsl.placeholder((), dtype="float32", name="t")
        ctx = Context(training=True, seed=seed)
        out = self._forward(xs, ctx)
        loss = self.loss_fn(out, *ys)
        if not isinstance(loss, Tensor) or len(loss.shape) != 0:
            raise UserError(f"Trainer: the loss must be a 0-d tensor, got {loss!r}")
        accuracy = self._accuracy(out, ys)
        params = self._param_list
        derived = differentiate(loss, [p.placeholder for p in params])
        grads = list(derived)
        new: Dict[int, Tensor] = {}
        if self.accumulate > 1:
            sums = [self._slots[self._acc[p.name]].placeholder for p in params]
            totals = [dsl.compute(p.shape, lambda *i, g=g, a=a: a[i] + g[i], name=f"{p.name}_grad_total")
                      for p, g, a in zip(params, grads, sums)]
            if not apply:
                for p, total in zip(params, totals):
                    new[self._acc[p.name]] = total
            else:
                scale = 1.0 / self.accumulate
                grads = [dsl.compute(p.shape, lambda *i, s=s: s[i] * scale, name=f"{p.name}_grad_mean")
                         for p, s in zip(params, totals)]
                for p in params:
                    new[self._acc[p.name]] = dsl.compute(p.shape, lambda *i, p=p: dsl.const(0.0, p.dtype),
                                                         name=f"{p.name}_grad_sum_reset")
        if apply:
            if self.clip_norm is not None:
                grads = _clipped(grads, self.clip_norm)
            hyper = Hyper(lr, t)
            moved = self._params_with_gradient(out, derived.adjoints)
            read = {id(x) for x in _placeholders([loss])}
            for p, g, raw in zip(params, grads, derived):
                # no gradient (PyTorch's grad None): untouched, unless the model's framework sets one
                # (zeros: 0 * p) where te_grad derives the constant 0
                if (id(p.placeholder) not in read or _derived_zero(raw)) and (moved is None or p.name not in moved):
                    continue
                states = [self._slots[k].placeholder for k in self._opt_states[p.name]]
                new_p, new_states = self.optimizer.update(p.placeholder, g, states, hyper)
                new[self._index[p.name]] = new_p
                for k, s in zip(self._opt_states[p.name], new_states):
                    new[k] = s
        for s in self._model_states:
            if id(s.placeholder) in ctx.updates:
                new[self._index[s.name]] = ctx.updates[id(s.placeholder)]
        if carry:  # every slot the step does not change is copied to the output (an exported state blob)
            for k, slot in enumerate(self._slots):
                if k not in new:
                    new[k] = _copy(slot.placeholder)
        extra = [loss] + ([accuracy] if accuracy is not None else [])
        slot_outputs = sorted(new)
        outputs = extra + [new[k] for k in slot_outputs]
        reads = {id(x) for x in _placeholders(outputs)}
        slot_inputs = [k for k, s in enumerate(self._slots) if id(s.placeholder) in reads]
        batch = xs + ys
        hyper_in = [seed, lr, t]
        kernel = build(outputs, batch + hyper_in + [self._slots[k].placeholder for k in slot_inputs],
                       threads=self.threads, wait=wait)
        # a slot not written by this kernel must still be carried to the other buffer set
        step = _Step(kernel, batch, len(extra), slot_inputs, slot_outputs, apply)
        step.carried = [k for k in range(len(self._slots)) if k not in set(slot_outputs)]
        return step

    def _step_for(self, arrays, apply: bool) -> _Step:
        return self._step_for_shapes(tuple(a.shape for a in arrays), apply)

    def _symbolic_shapes(self):
        """The batch's shapes with the batch dimension the size variable ``batch``."""
        return tuple((self._batch_var,) + tuple(t.shape[1:]) for t in self.inputs + self.targets)

    def _step_for_shapes(self, shapes, apply: bool, wait: bool = True, exact: bool = False) -> _Step:
        if self.dynamic_batch and self.static_reason is None and not exact:
            key = ("batch", apply)
            step = self._steps.get(key)
            if step is not None:
                return step
            try:
                step = self._build_step(self._symbolic_shapes(), apply, wait)
                if wait:
                    step.kernel.wait()
            except Exception as e:  # noqa: BLE001 - a model the size variable does not fit: exact kernels
                self.static_reason = f"{type(e).__name__}: {e}"
                warnings.warn(f"Trainer: cannot build the step on a batch size variable ({self.static_reason}); "
                              "building a kernel per batch size instead", RuntimeWarning, stacklevel=3)
                self._steps.clear()
            else:
                self._steps[key] = step
                return step
        key = (shapes, apply)
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = self._build_step(shapes, apply, wait)
        return step

    def compile(self, *batch_sizes: int) -> float:
        """Build the step kernel(s) for batches of each of ``batch_sizes`` (default: the
        placeholders' batch) now rather than on the first :meth:`update`; returns the seconds
        it took, until every kernel is ready. LLVM compiles each kernel in the background
        while the next one is prepared. With ``dynamic_batch`` one kernel (per kind of step)
        serves every batch size."""
        t0 = time.perf_counter()
        steps = []
        for batch_size in batch_sizes or (None,):
            shapes = tuple(t.shape if batch_size is None else (batch_size,) + t.shape[1:]
                           for t in self.inputs + self.targets)
            for apply in ((True,) if self.accumulate == 1 else (False, True)):
                steps.append(self._step_for_shapes(shapes, apply, wait=False))
        for step in steps:
            step.kernel.wait()
        return time.perf_counter() - t0

    @property
    def kernels(self) -> list:
        """The step kernels built so far: one (per kind of step with gradient accumulation)
        for every batch size with ``dynamic_batch``, else one per batch shape; for
        inspection: ``kern.loops``, ``kern.llvm_ir``."""
        return [step.kernel for step in self._steps.values()]

    # -- training --------------------------------------------------------------------------------
    def _check_batch(self, arrays):
        if len(arrays) != len(self.inputs) + len(self.targets):
            raise UserError(f"Trainer: expected {len(self.inputs)} inputs and {len(self.targets)} targets, "
                            f"got {len(arrays)} arrays")
        out = []
        for t, a in zip(self.inputs + self.targets, arrays):
            a = np.ascontiguousarray(a)
            if a.dtype != np.dtype(t.dtype):
                raise UserError(f"Trainer: {t.name} must be {t.dtype}, got {a.dtype}; convert it with "
                                f".astype(np.{t.dtype})")
            if a.shape[1:] != t.shape[1:]:
                raise UserError(f"Trainer: {t.name} must have shape [batch] + {list(t.shape[1:])}, got "
                                f"{list(a.shape)}")
            out.append(a)
        if len({a.shape[0] for a in out}) != 1:
            raise UserError(f"Trainer: the batch arrays have different sizes {[a.shape[0] for a in out]}")
        self._check_min_batch(out[0].shape[0] if out and out[0].ndim else None)
        return out

    @property
    def _min_batch(self) -> int:
        """The least batch the model holds for (``min_batch``: 2 for an imported model with a
        dynamic batch, 1 for any other)."""
        return getattr(self.model, "min_batch", 1)

    def _check_min_batch(self, n):
        """A batch smaller than the model holds for (``min_batch``: an imported model with a
        dynamic batch holds for 2 on, as torch.export traced it) is a :class:`UserError`."""
        least = self._min_batch
        if n is not None and n < least:
            raise UserError(f"Trainer: a batch of {n}: {type(self.model).__name__} holds for batches of at least "
                            f"{least} ({getattr(self.model, 'min_batch_reason', '')}); pass larger batches")

    def update(self, *batch, lr: Optional[float] = None) -> float:
        """One training step on a batch (inputs then targets, numpy arrays); returns the loss.

        ``lr`` overrides the optimizer's learning rate for this step (a schedule)."""
        arrays = self._check_batch(batch)
        if lr is not None:
            lr = check_hyper("Trainer.update", "lr", lr)
        self._calls += 1
        apply = self._calls % self.accumulate == 0
        step = self._step_for(arrays, apply)
        if apply:
            self.t += 1
        self._seed += 1
        self._scalars["lr"][()] = self.optimizer.lr if lr is None else lr
        self._scalars["t"][()] = max(self.t, 1)
        self._scalars["seed"][()] = self._seed
        cur, nxt = self._current, 1 - self._current
        extra = [np.empty((), dtype=o.dtype) for o in step.kernel.outputs[:step.n_out_extra]]
        ins = [a.ctypes.data for a in arrays] + [self._scalars[k].ctypes.data for k in ("seed", "lr", "t")] + \
              [self._slots[k].arrays[cur].ctypes.data for k in step.slot_inputs]
        outs = [e.ctypes.data for e in extra] + [self._slots[k].arrays[nxt].ctypes.data for k in step.slot_outputs]
        if step.symbolic:
            step.kernel.run_pointers(ins, outs, sizes={"batch": arrays[0].shape[0]})
        else:
            step.kernel.run_pointers(ins, outs)
        for k in step.carried:
            np.copyto(self._slots[k].arrays[nxt], self._slots[k].arrays[cur])
        self._current = nxt
        self.last = {"loss": float(extra[0])}
        if step.n_out_extra > 1:
            self.last["accuracy"] = float(extra[1])
        return self.last["loss"]

    def fit(self, x: np.ndarray, y: np.ndarray, epochs: int = 1, batch_size: int = 64, shuffle: bool = True,
            seed: int = 0, drop_last: bool = False, lr_schedule: Callable[[int], float] = None) -> List[float]:
        """Epochs of :meth:`update` over ``(x, y)`` in batches; returns the mean loss of each epoch.

        A progress line is printed when the work takes more than a couple of seconds
        (``progress=False`` at construction turns it off). ``lr_schedule(step)`` gives the
        learning rate of each step."""
        rng = np.random.default_rng(seed)
        n = len(x)
        last = n % int(batch_size) if isinstance(batch_size, numbers.Integral) and batch_size > 0 else 0
        if last and not drop_last and last < self._min_batch:  # before any step, not after one
            raise UserError(f"Trainer.fit: {n} samples in batches of {batch_size} leave a last batch of {last}; "
                            f"{type(self.model).__name__} holds for batches of at least "
                            f"{self._min_batch}: pass drop_last=True or another batch_size")
        means = []
        start = time.monotonic()
        for epoch in range(epochs):
            order = rng.permutation(n) if shuffle else np.arange(n)
            losses, count = [], 0
            for at in range(0, n, batch_size):
                idx = order[at:at + batch_size]
                if drop_last and len(idx) < batch_size:
                    continue
                lr = lr_schedule(self.t) if lr_schedule is not None else None
                losses.append(self.update(x[idx], y[idx], lr=lr) * len(idx))
                count += len(idx)
                if self.progress and time.monotonic() - start > 2.0:
                    sys.stderr.write(f"\repoch {epoch + 1}/{epochs}: {count}/{n} samples, loss "
                                     f"{self.last['loss']:.4f}")
                    sys.stderr.flush()
            means.append(sum(losses) / max(count, 1))
        if self.progress and time.monotonic() - start > 2.0:
            sys.stderr.write("\n")
        return means

    @property
    def threads_used(self) -> int:
        """The threads the step kernels run on."""
        from .. import default_threads
        return self.threads if self.threads is not None else default_threads()

    # -- prediction -----------------------------------------------------------------------------
    def predict(self, *inputs: np.ndarray):
        """The model's output on ``inputs`` (numpy arrays; a tuple of arrays for a model returning
        several tensors): the forward kernel alone, batch norm with its running statistics,
        dropout off. With ``dynamic_batch`` one forward kernel, built on the batch size
        variable, serves every batch size (inputs whose other dimensions are the
        placeholders'); otherwise, or where the model needs an int batch, one per shape."""
        arrays = [np.ascontiguousarray(a) for a in inputs]
        self._check_min_batch(arrays[0].shape[0] if arrays and arrays[0].ndim else None)
        kernel, slots = self._predict_kernel(tuple(a.shape for a in arrays))
        for t, a in zip(self.inputs, arrays):
            if a.dtype != np.dtype(t.dtype):
                raise UserError(f"predict: {t.name} must be {t.dtype}, got {a.dtype}")
        return kernel(*arrays, *[self._slots[k].arrays[self._current] for k in slots])

    # -- state ----------------------------------------------------------------------------------
    @property
    def params(self) -> Dict[str, np.ndarray]:
        """The parameters, by name (copies)."""
        return {p.name: self._slots[self._index[p.name]].arrays[self._current].copy() for p in self._param_list}

    @property
    def states(self) -> Dict[str, np.ndarray]:
        """Every state (batch norm statistics, optimizer moments), by name (copies)."""
        names = {p.name for p in self._param_list}
        return {s.name: s.arrays[self._current].copy() for s in self._slots if s.name not in names}

    def set(self, values: Dict[str, np.ndarray]):
        """Overwrite parameters or states by name (e.g. weights from a PyTorch ``state_dict``)."""
        for name, value in values.items():
            if name not in self._index:
                raise UserError(f"Trainer: no parameter or state named {name!r}")
            slot = self._slots[self._index[name]]
            value = np.asarray(value)
            if value.shape != slot.placeholder.shape:
                raise UserError(f"Trainer: {name} has shape {list(slot.placeholder.shape)}, got {list(value.shape)}")
            np.copyto(slot.arrays[self._current], value.astype(slot.placeholder.dtype))

    def save(self, path: str):
        """Parameters, states and the step count to an ``.npz`` file."""
        np.savez(path, **{s.name: s.arrays[self._current] for s in self._slots},
                 **{"__t__": np.array(self.t), "__calls__": np.array(self._calls), "__seed__": np.array(self._seed)})

    def load(self, path: str):
        """What :meth:`save` wrote (the same model and optimizer).

        The file is checked whole before anything is overwritten: a file that is missing,
        not an ``.npz`` archive, truncated or corrupt, lacking a parameter, state or step
        count, holding one of another shape or dtype, or holding names this trainer does
        not have (another model or optimizer) is a :class:`UserError` naming the file and
        the problem. Pickled data is never loaded."""
        values, counters = _read_checkpoint(path, self._slots)
        self.set(values)
        self.t, self._calls, self._seed = counters

    # -- deployment -----------------------------------------------------------------------------
    def export(self, path: str, target: str = "host", *, cpu: str = None, features: str = None,
               threads: int = 1, shared: bool = False) -> Dict[str, object]:
        """The training step and the prediction as C entry points in ``path.o`` / ``path.h``
        (see docs/EXPORT.md), for the batch size of the input placeholders::

            int NAME_step(const float *x, const int64_t *y, int64_t seed, float lr, float t,
                          const void *state_in, void *state_out, float *loss, float *accuracy);
            int NAME_predict(const float *x, const void *state, float *out);

        ``state`` is one blob holding every parameter and state (optimizer moments, batch
        norm statistics) at the byte offsets the header gives; a step reads ``state_in`` and
        writes the next state to ``state_out`` (two blobs used in turn, as the trainer does).
        Members keep their dtypes (an int64 ``num_batches_tracked``, float64 parameters), each
        at a 16-byte aligned offset; a state the step only reads (a frozen parameter, a
        constant of an imported model) is copied from ``state_in`` to ``state_out``, so every
        blob a step writes is complete. Several model inputs come first, in order; a model
        returning several tensors has one buffer each in ``NAME_predict`` (``out0``, ``out1``, ...).
        The header documents each scalar (:data:`SCALAR_DOCS`): ``t`` is the step count
        **from 1** (a counter from 0 divides by zero in Adam's bias correction and repeats
        SGD momentum's first step), ``seed`` a new value each step (dropout), ``lr`` the
        step's learning rate. The current state is in the object as
        ``NAME_initial_state`` (``const float`` when every member is float32, else the blob's
        bytes as ``int32_t`` words: ``memcpy`` it). Returns the file paths, ``state_bytes``,
        the ``layout`` (name -> byte offset and shape) and the members' ``dtypes``."""
        import os
        from .. import export as export_kernels
        if self.accumulate != 1:
            raise UserError("Trainer.export: gradient accumulation is not exported; build the trainer "
                            "with accumulate=1")
        from codegen.export import c_name
        name = c_name(os.path.basename(path))
        shapes = tuple(t.shape for t in self.inputs + self.targets)
        self._check_min_batch(shapes[0][0] if shapes and shapes[0] and isinstance(shapes[0][0], int) else None)
        step = self._step_for_shapes(shapes, True, exact=True)  # the C entry point has the placeholders' batch
        if step.carried:  # states the step only reads (frozen parameters, constants): copied to state_out
            step = self._build_step(shapes, True, carry=True)
        offsets, total = [], 0
        for s in self._slots:
            total = -(-total // 16) * 16
            offsets.append(total)
            total += s.placeholder.size * np.dtype(s.placeholder.dtype).itemsize
        total = -(-total // 4) * 4  # whole 4-byte words (a bool state may end mid-word)
        kern = step.kernel
        inputs = kern.inputs
        batch, (seed, lr, t) = inputs[:len(step.batch)], inputs[len(step.batch):len(step.batch) + 3]
        state_in = [(self._slots[k].placeholder, offsets[k]) for k in step.slot_inputs]
        outs = kern.outputs
        state_out = [(outs[step.n_out_extra + j], offsets[k]) for j, k in enumerate(step.slot_outputs)]
        extra = [("buffer", what, o) for what, o in zip(("loss", "accuracy"), outs[:step.n_out_extra])]
        step_args = list(batch) + [("scalar", seed, SCALAR_DOCS["seed"]), ("scalar", lr, SCALAR_DOCS["lr"]),
                                   ("scalar", t, SCALAR_DOCS["t"]),
                                   ("group", "state_in", state_in, False, total,
                                    "every parameter and state before the step (read only)"),
                                   ("group", "state_out", state_out, True, total,
                                    "receives them after the step; must not overlap state_in: keep two "
                                    "blobs and swap them after each step")] + extra
        predict_kern, slots = self._predict_kernel(tuple(a.shape for a in self.inputs), exact=True)
        pin = predict_kern.inputs
        pouts = predict_kern.outputs  # a model of several outputs: out0, out1, ...
        predict_args = list(pin[:len(self.inputs)]) + [
            ("group", "state", [(pin[len(self.inputs) + j], offsets[k]) for j, k in enumerate(slots)], False, total)
        ] + [("buffer", "out" if len(pouts) == 1 else f"out{j}", o) for j, o in enumerate(pouts)]
        blob = np.zeros(total, np.uint8)
        for k, s in enumerate(self._slots):
            value = np.ascontiguousarray(s.arrays[self._current], dtype=s.placeholder.dtype)
            blob[offsets[k]: offsets[k] + value.nbytes] = value.reshape(-1).view(np.uint8)
        # the initial state as float values where every member is float32, else its bytes as int32 words
        all_float = all(s.placeholder.dtype == "float32" for s in self._slots)
        blob = blob.view(np.float32 if all_float else np.int32)
        files = export_kernels(path, {f"{name}_step": (kern, step_args), f"{name}_predict": (predict_kern, predict_args)},
                               target, cpu=cpu, features=features, shared=shared, threads=threads,
                               constants={f"{name}_initial_state": blob})
        layout = {s.name: (offsets[k], s.placeholder.shape) for k, s in enumerate(self._slots)}
        dtypes_ = {s.name: s.placeholder.dtype for s in self._slots}
        return {**files, "state_bytes": total, "layout": layout, "dtypes": dtypes_,
                "has_accuracy": step.n_out_extra > 1}

    def _predict_kernel(self, shapes, exact: bool = False):
        from .. import build
        given = [tuple(t.shape[1:]) for t in self.inputs]
        if self.dynamic_batch and not exact and self._predict_static_reason is None and len(shapes) == len(given) and \
                all(len(s) >= 1 and tuple(s[1:]) == g for s, g in zip(shapes, given)):
            entry = self._predict.get("batch")
            if entry is not None:
                return entry
            try:  # one kernel for every batch size, as the step
                entry = self._predict_kernel_for(self._symbolic_shapes()[:len(self.inputs)], build)
                entry[0].wait()
            except Exception as e:  # noqa: BLE001 - a model the size variable does not fit: a kernel per shape
                self._predict_static_reason = f"{type(e).__name__}: {e}"
            else:
                self._predict["batch"] = entry
                return entry
        entry = self._predict.get(shapes)
        if entry is None:
            entry = self._predict[shapes] = self._predict_kernel_for(shapes, build)
        return entry

    def _predict_kernel_for(self, shapes, build):
        xs = [dsl.placeholder(s, dtype=t.dtype, name=t.name) for s, t in zip(shapes, self.inputs)]
        ctx = Context(training=False)
        out = self._forward(xs, ctx)
        if ctx.updates:  # a prediction changes no state: such a model's outputs would drift from PyTorch's
            names = [s.name for s in self._model_states if id(s.placeholder) in ctx.updates] or ["?"]
            raise UserError(f"predict: the model changes its state in evaluation mode ({', '.join(names)}); "
                            "te_grad's prediction does not update state")
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not outs or not all(isinstance(o, Tensor) for o in outs):
            raise UserError(f"predict: the model must return a tensor or a tuple of tensors, got "
                            f"{type(out).__name__}" + (f" of {', '.join(type(o).__name__ for o in outs)}"
                                                       if isinstance(out, (tuple, list)) else ""))
        reads = {id(x) for x in _placeholders(outs)}
        slots = [k for k, s in enumerate(self._slots) if id(s.placeholder) in reads]
        inputs = xs + [self._slots[k].placeholder for k in slots]
        distinct, seen = [], {id(t) for t in inputs}
        for k, o in enumerate(outs):  # an input or a repeated output returned: a copy of its own
            if id(o) in seen:
                o = dsl.compute(o.shape, lambda *i, o=o: o[i], name=f"out{k}")
            seen.add(id(o))
            distinct.append(o)
        return build(distinct, inputs, threads=self.threads), slots

    # -- profiling ------------------------------------------------------------------------------
    def profile(self, *batch, repeat: int = 5, show: bool = True) -> List[dict]:
        """Per-stage times of one training step on ``batch`` (the median of ``repeat`` runs, one
        thread), without changing the parameters; sorted slowest first, printed if ``show``."""
        arrays = self._check_batch(batch)
        step = self._step_for(arrays, True)
        cur, nxt = self._current, 1 - self._current
        extra = [np.empty((), dtype=o.dtype) for o in step.kernel.outputs[:step.n_out_extra]]
        scalars = [self._scalars["seed"], np.asarray(self.optimizer.lr, np.float32), np.asarray(max(self.t, 1),
                                                                                                   np.float32)]
        ins = list(arrays) + scalars + [self._slots[k].arrays[cur] for k in step.slot_inputs]
        outs = extra + [self._slots[k].arrays[nxt] for k in step.slot_outputs]
        rows = step.kernel.profile(ins, outs, repeat=repeat)
        if show:
            total = sum(r["ms"] for r in rows)
            print(f"training step: {total:.3f} ms in {len(rows)} stages")
            for r in sorted(rows, key=lambda r: -r["ms"])[:25]:
                print(f"  {r['ms']:9.4f} ms  {100 * r['ms'] / max(total, 1e-12):5.1f}%  {r['stage']}")
        return rows


#: what the scalar arguments of an exported training step mean (written into the C header)
SCALAR_DOCS = {
    "seed": "the seed of this step's random numbers (dropout masks): give each step a new value, as "
            "Trainer.update does (1, 2, 3, ...); a repeated seed repeats the masks. Not read by a model "
            "without dropout.",
    "lr": "the learning rate of this step (a schedule passes a different one each step); a finite "
          "number >= 0. Trainer.update passes the optimizer's lr.",
    "t": "the optimizer's step count: 1 for the first step (NOT 0), then 2, 3, ... one more each step. "
         "Adam and AdamW divide by 1 - beta^t (their bias correction: t = 0 divides by zero) and SGD "
         "with momentum takes t <= 1 as the first step (it sets the momentum buffer instead of "
         "decaying it), so a counter from 0 silently changes training. Pass a float (1.0f, 2.0f, ...).",
}

_COUNTERS = ("__t__", "__calls__", "__seed__")


def _read_checkpoint(path, slots: List[_Slot]):
    """``({name: array}, (t, calls, seed))`` from a file :meth:`Trainer.save` wrote, checked
    against ``slots``; a :class:`UserError` naming the file and the problem otherwise."""
    import zipfile
    where = f"Trainer.load: {path}"
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{where}: is a directory, not a checkpoint file") from None
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as err:
        # numpy reads a file without the .npy/.npz magic as a pickle, which allow_pickle=False refuses
        raise UserError(f"{where}: not a te_grad checkpoint (an .npz archive written by Trainer.save): "
                        f"the file is corrupt, truncated or of another format ({type(err).__name__}: "
                        f"{str(err)[:120]})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UserError(f"{where}: holds a single array, not a te_grad checkpoint (an .npz archive "
                        f"written by Trainer.save)")
    with archive as data:
        names = list(data.files)
        expected = [s.name for s in slots]
        missing = [n for n in expected + list(_COUNTERS) if n not in names]
        if missing:
            kind = "not a te_grad checkpoint (no step counters) or one of another model or optimizer" \
                if any(c in missing for c in _COUNTERS) else "a checkpoint of another model or optimizer"
            raise UserError(f"{where}: missing {', '.join(missing[:6])}"
                            f"{f' and {len(missing) - 6} more' if len(missing) > 6 else ''}: {kind}")
        extra = [n for n in names if n not in expected and n not in _COUNTERS]
        if extra:
            raise UserError(f"{where}: holds {', '.join(extra[:6])}, which this trainer has no parameter "
                            f"or state for: a checkpoint of another model or optimizer")
        values, counters = {}, []
        for name in expected + list(_COUNTERS):
            try:
                value = data[name]
            except (ValueError, EOFError, OSError, zipfile.BadZipFile, KeyError) as err:
                raise UserError(f"{where}: {name} cannot be read: the file is corrupt or truncated "
                                f"({type(err).__name__}: {str(err)[:120]})") from None
            if name in _COUNTERS:
                if value.shape != () or value.dtype.kind not in "iu":
                    raise UserError(f"{where}: {name} must be a whole number, got {value.dtype} of shape "
                                    f"{list(value.shape)}: not a te_grad checkpoint")
                counters.append(int(value))
                continue
            slot = slots[expected.index(name)]
            want = slot.placeholder
            if value.shape != want.shape:
                raise UserError(f"{where}: {name} has shape {list(value.shape)}, this trainer's has "
                                f"{list(want.shape)}")
            if value.dtype != np.dtype(want.dtype):
                raise UserError(f"{where}: {name} is {value.dtype}, this trainer's is {want.dtype}")
            values[name] = value
    return values, tuple(counters)


def _clipped(grads: List[Tensor], clip: float) -> List[Tensor]:
    """The gradients scaled by ``min(1, clip / (norm + 1e-6))``, ``norm`` their global L2 norm."""
    parts = []
    for g in grads:
        axes = [dsl.reduce_axis(n, f"k{d}") for d, n in enumerate(g.shape)]
        if axes:
            parts.append(dsl.compute((), lambda g=g, axes=axes: dsl.sum(g[tuple(axes)] * g[tuple(axes)], axis=axes),
                                     name=f"{g.name}_sq"))
        else:
            parts.append(dsl.compute((), lambda g=g: g[()] * g[()], name=f"{g.name}_sq"))
    total = parts[0]
    for p in parts[1:]:
        total = nn.add(total, p)
    scale = dsl.compute((), lambda: dsl.minimum(1.0, clip / (dsl.sqrt(total[()]) + 1e-6)), name="clip_scale")
    return [dsl.compute(g.shape, lambda *i, g=g: g[i] * scale[()], name=f"{g.name}_clipped") for g in grads]


def _copy(x: Tensor) -> Tensor:
    """``x`` unchanged, as a new tensor (a state an exported step carries from ``state_in`` to ``state_out``)."""
    if x.ndim == 0:
        return dsl.compute((), lambda: x[()], name=f"{x.name}_carried")
    return dsl.compute(x.shape, lambda *i: x[i], name=f"{x.name}_carried")


def _placeholders(tensors):
    from ..graph import topo_order
    return [t for t in topo_order(list(tensors)) if t.is_placeholder]
