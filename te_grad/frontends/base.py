"""What te_grad's framework frontends share, free of any framework (imports neither torch nor jax).

A frontend turns a te_grad op (a Python function of te_grad tensors, see
:func:`tensor_params`) into a function of some framework's arrays. Everything that does
not depend on the framework lives here:

- :class:`FrontendOp`: the op's tensor arguments and attributes (checked against ``fn``'s
  signature), the count of arguments of a call, the key of a call (input shapes and
  te_grad dtypes, with the framework's dtypes read through the table :attr:`FrontendOp.dtypes`)
  and the :class:`Spec` of that key, from a bounded :class:`SpecCache` (``max_shapes``,
  least recently used dropped first) behind an optional fast path keyed by the
  framework's own shape objects (and :meth:`FrontendOp.recent`: the spec of the op's
  previous call, when a call has its fast key and it was exact);
- :class:`Spec`: the te_grad graph of one key (placeholders of those shapes and dtypes,
  ``fn``), its VJP kernels built on first use (:func:`te_grad.build_vjp`), the backward
  kernels for each subset of inputs that need a gradient (the backward mask), the order of
  the residuals and of the backward kernel's arguments;
- :func:`dtype_table`: the dtypes a frontend passes, as a table from the framework's
  dtype objects to te_grad's names.

Dynamic dimensions. A dimension of an argument is *dynamic* when the user declares it
(``dynamic_dims={"x": 0}``), or once the framework hands the op a symbolic size there (a
``torch.SymInt`` under ``torch.compile``: the framework decided that dimension changes; the op
remembers it for its later calls). The key of a call then names a size variable instead of
the extent (``(("x_0", 8), "float32")``): the graph is built once on ``tg.var`` size
variables and its kernels serve every extent, bound from the arguments' shapes at each call
(:meth:`FrontendOp.bind` returns the spec and the sizes, by variable name; the output and
residual shapes are the graph's size expressions evaluated on them, which stay symbolic when
the sizes are). Dynamic dimensions of equal extent in a call share one variable (PyTorch's
"duck sizing"), so ``x`` and ``labels`` of one batch keep agreeing. Other dimensions keep
exact kernels, built per shape. If ``fn`` cannot be built on size variables, or its kernels
cannot, the op falls back to exact kernels per shape and says why in
:attr:`FrontendOp.static_reason` (a symbolic size is then specialized: under torch.compile,
a guard on its value).

A frontend subclasses :class:`FrontendOp`, saying how to read an argument's shape and
dtype (:meth:`FrontendOp.shape_dtype`) and, if it likes, a cheap key for the fast path
(:meth:`FrontendOp.fast_key`), and registers the op with its framework (``te_grad.torch``:
``torch.library`` custom ops; ``te_grad.jax``: ``jax.custom_vjp`` and host callbacks).
"""
from __future__ import annotations

import inspect
import numbers
import threading
import warnings
from collections import OrderedDict
from typing import Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Sequence, Tuple

from .. import dsl, dtypes, sizes as tg_sizes
from ..errors import UserError
from ..ir import SizeVar, Tensor

#: the te_grad dtypes a frontend passes in and out, in the order error messages list them
FRONTEND_DTYPES = (dtypes.FLOAT32, dtypes.FLOAT64, dtypes.INT32, dtypes.INT64, dtypes.BOOL)

#: input shapes (and dtypes) an op of a frontend keeps built at once, by default
MAX_SHAPES = 64


def dtype_table(native: Callable[[str], Hashable]) -> Dict[Hashable, str]:
    """``{framework dtype: te_grad dtype name}`` for :data:`FRONTEND_DTYPES`, where
    ``native(name)`` is the framework's dtype of that name (``lambda n: getattr(torch, n)``)."""
    return {native(name): name for name in FRONTEND_DTYPES}


def tensor_params(fn: Callable) -> Tuple[List[str], Dict[str, object]]:
    """``fn``'s tensor parameters (positional, without a default) and its attributes (with one)."""
    params = list(inspect.signature(fn).parameters.values())
    tensors = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is inspect.Parameter.empty]
    attrs = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    if not tensors:
        raise UserError(f"{getattr(fn, '__name__', fn)} takes no tensor arguments (parameters without a "
                        "default value)")
    return tensors, attrs


def check_attrs(fn: Callable, defaults: Dict[str, object], given: Dict[str, object], where: str = "") -> dict:
    """``fn``'s attributes: its ``defaults`` overridden by ``given``, each of which must be one
    of them (a :class:`UserError` naming the others, prefixed by ``where``)."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise UserError(f"{where}{sorted(unknown)} are not attributes of {getattr(fn, '__name__', fn)} "
                        f"(its attributes: {sorted(defaults)})")
    return {**defaults, **given}


def check_max_shapes(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"max_shapes must be a positive int (how many input shapes an op keeps built), "
                        f"got {value!r}")
    return value


def check_dynamic_dims(value, names: Sequence[str], where: str = "") -> Dict[int, frozenset]:
    """``dynamic_dims`` (``{argument name: dim or dims}``, or a sequence of argument names whose
    dimension 0 is dynamic) as ``{argument index: dims}``; anything else is a :class:`UserError`."""
    if value is None:
        return {}
    if isinstance(value, str) or not isinstance(value, (Mapping, list, tuple)):
        raise UserError(f"{where}dynamic_dims must be a dict {{argument name: dim or tuple of dims}} (or a list "
                        f"of argument names, dimension 0 each), got {value!r}")
    if not isinstance(value, Mapping):
        value = {name: 0 for name in value}
    out: Dict[int, frozenset] = {}
    for name, dims in value.items():
        if name not in names:
            raise UserError(f"{where}dynamic_dims names {name!r}, which is not a tensor argument "
                            f"(they are {', '.join(names)})")
        dims = (dims,) if isinstance(dims, numbers.Integral) else dims
        if not isinstance(dims, (list, tuple, set, frozenset)) or not all(
                isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise UserError(f"{where}dynamic_dims[{name!r}] must be a dimension (an int >= 0) or a tuple of "
                            f"them, got {dims!r}")
        out[names.index(name)] = frozenset(int(d) for d in dims)
    return out


class NamedSizes(Mapping):
    """A binding of size variables by their names (``{"x_0": 8}``) that
    :func:`te_grad.sizes.value` reads for any variable of that name, so shapes of kernels
    whose graphs were rebuilt (simplified, loaded from the build cache) evaluate too. The
    values may be the framework's symbolic sizes (``torch.SymInt``): the arithmetic of a size
    expression (``+ - * // %``) then builds the symbolic result."""

    def __init__(self, by_name: Mapping[str, object]):
        self.by_name = dict(by_name)

    def __getitem__(self, v):
        return self.by_name[v.name if isinstance(v, SizeVar) else v]

    def get(self, v, default=None):
        return self.by_name.get(v.name if isinstance(v, SizeVar) else v, default)

    def __contains__(self, v):
        return (v.name if isinstance(v, SizeVar) else v) in self.by_name

    def __iter__(self) -> Iterator:
        return iter(self.by_name)

    def __len__(self):
        return len(self.by_name)

    def shape(self, shape) -> tuple:
        """``shape`` with its size expressions evaluated on these sizes."""
        return tuple(s if isinstance(s, numbers.Integral) else tg_sizes.value(s, self) for s in shape)


#: the sizes of a call whose spec has no size variable
NO_SIZES = NamedSizes({})


class SpecCache:
    """An op's graphs and kernels by input shapes and dtypes: at most ``size`` of them, the
    least recently used dropped first (with its kernels, whose engines are freed once the
    JIT's own bounded cache lets go of them too), so a long run over ever new shapes stays
    flat in memory. ``on_evict(spec)`` is told of each one dropped. Thread-safe."""

    def __init__(self, size: int = MAX_SHAPES, on_evict: Callable = None):
        self._size = check_max_shapes(size)
        self._on_evict = on_evict
        self._specs: "OrderedDict[tuple, object]" = OrderedDict()
        self.lock = threading.RLock()

    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, value: int):
        with self.lock:
            self._size = check_max_shapes(value)
            self._trim()

    def get(self, key, make: Callable):
        """The spec of ``key``, made by ``make()`` if it is not kept."""
        with self.lock:
            spec = self._specs.get(key)
            if spec is not None:
                self._specs.move_to_end(key)
                return spec
            spec = self._specs[key] = make()
            self._trim()
            return spec

    def _trim(self):
        while len(self._specs) > self._size:
            _, spec = self._specs.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(spec)

    def discard(self, key):
        """Drop ``key``'s spec (if kept), telling ``on_evict``."""
        with self.lock:
            spec = self._specs.pop(key, None)
            if spec is not None and self._on_evict is not None:
                self._on_evict(spec)

    def __len__(self):
        return len(self._specs)

    def __contains__(self, key):
        return key in self._specs

    def keys(self):
        with self.lock:
            return list(self._specs)


class Spec:
    """The te_grad graph of an op for one combination of input shapes and dtypes (``key``:
    ``((shape, dtype), ...)`` per tensor argument), and its kernels, built on first use.
    An extent that is a string in ``key`` is a size variable of that name (``tg.var``): the
    graph and kernels then serve every value of it (:attr:`symbolic`, :attr:`size_vars`).

    ``accepts``: the te_grad dtypes the framework can receive (an output of another dtype is
    a :class:`UserError` naming ``framework``)."""

    def __init__(self, fn: Callable, names: Sequence[str], attrs: dict, key: tuple, save=None,
                 threads: Optional[int] = None, accepts=FRONTEND_DTYPES, framework: str = "the framework"):
        self.key = key
        self.save = save
        self.threads = threads
        #: the size variables of the key's symbolic extents, by name
        self.size_vars: Dict[str, SizeVar] = {}
        for shape, _ in key:
            for e in shape:
                if isinstance(e, str) and e not in self.size_vars:
                    self.size_vars[e] = tg_sizes.var(e)
        self.symbolic = bool(self.size_vars)
        self.inputs = [dsl.placeholder(tuple(self.size_vars[e] if isinstance(e, str) else e for e in shape),
                                       dtype=dt, name=n) for n, (shape, dt) in zip(names, key)]
        out = fn(*self.inputs, **attrs)
        self.single = isinstance(out, Tensor)
        self.outputs = [out] if self.single else list(out)
        for y in self.outputs:
            if not isinstance(y, Tensor):
                raise UserError(f"{getattr(fn, '__name__', 'the op')} must return te_grad tensors, got {y!r}")
            if y.dtype not in accepts:
                raise UserError(f"output {y.name} has dtype {y.dtype}, which {framework} cannot receive")
        #: per input: whether it can have a gradient (float inputs; integer ids get none)
        self.differentiable = [dtypes.is_float(x.dtype) for x in self.inputs]
        self._plain_outputs = None
        self._saved_order = None  # per saved tensor: its position among the forward's results
        self._argument_plans: Dict[int, tuple] = {}  # id(vjp) -> (vjp, positions of its backward's arguments)
        self._vjp = None
        self._backward: Dict[tuple, object] = {}
        self._lock = threading.Lock()
        #: what a frontend works out once per spec and keeps with it (its own keys)
        self.frontend_cache: Dict[Hashable, object] = {}

    def _build_vjp(self, wrt, save):
        from ..residuals import build_vjp
        options = {} if self.threads is None else {"threads": self.threads}
        return build_vjp(self.outputs, self.inputs, wrt=wrt, save=save, **options)

    @property
    def vjp(self):
        """The forward kernel and the residual choice (compiled on first use), with the
        backward kernel of every differentiable input."""
        with self._lock:
            if self._vjp is None:
                self._vjp = self._build_vjp([x for x, d in zip(self.inputs, self.differentiable) if d], self.save)
            return self._vjp

    @property
    def plain_outputs(self) -> bool:
        """Whether the forward kernel's outputs are distinct computed tensors (none is an input,
        none appears twice), so the kernel can write straight into the framework's memory."""
        if self._plain_outputs is None:
            outs = self.vjp.forward.outputs
            self._plain_outputs = not any(t.is_placeholder for t in outs) and \
                len({id(t) for t in outs}) == len(outs)
        return self._plain_outputs

    def forward_results(self, sizes: NamedSizes = NO_SIZES) -> List[Tuple[tuple, str]]:
        """``(shape, dtype)`` of the forward kernel's results at ``sizes`` (those of the call,
        from :meth:`FrontendOp.bind`): the outputs, then the residuals."""
        return [(sizes.shape(t.shape), t.dtype) for t in self.outputs + self.vjp.residuals]

    def saved_from(self, outputs, residuals) -> list:
        """The saved values in the VJP's ``saved`` order, from the forward kernel's results
        (``outputs``, then ``residuals``; an output that is saved appears once, as an output)."""
        order = self._saved_order
        if order is None:  # where each saved value sits among the results, worked out once
            vjp = self.vjp
            by_id = {id(t): k for k, t in enumerate(self.outputs + vjp.residuals)}
            order = self._saved_order = [by_id[id(t)] for t in vjp.saved]
        values = list(outputs) + list(residuals)
        return [values[k] for k in order]

    def needs(self, requested: Sequence) -> Tuple[bool, ...]:
        """The backward mask: per input, whether its gradient is computed (``requested`` by
        the framework, and differentiable)."""
        return tuple(bool(n) and d for n, d in zip(requested, self.differentiable))

    def backward_for(self, needs: Tuple[bool, ...]):
        """The VJP whose backward kernel computes the gradients of the inputs in ``needs``
        from the residuals of :attr:`vjp` (its ``saved`` are some of those)."""
        needs = tuple(needs)
        with self._lock:
            got = self._backward.get(needs)
        if got is not None:
            return got
        vjp = self.vjp
        if all(needs[k] == self.differentiable[k] for k in range(len(needs))):
            got = vjp
        else:
            got = self._build_vjp([x for x, n in zip(self.inputs, needs) if n], vjp.saved)
        with self._lock:
            self._backward[needs] = got
        return got

    def backward_arguments(self, vjp, inputs: Sequence, residuals: Sequence, heads: Sequence) -> list:
        """The arguments of ``vjp.backward`` (``vjp`` from :meth:`backward_for`), from the values
        of all inputs, the residuals in :attr:`vjp`'s ``saved`` order and one head per output."""
        with self._lock:
            got = self._argument_plans.get(id(vjp))
        if got is None or got[0] is not vjp:  # the picks, worked out once on positions
            n_saved, n_in = len(self.vjp.saved), len(self.inputs)
            positions = self._pick_arguments(vjp, range(n_saved), range(n_saved, n_saved + n_in),
                                             range(n_saved + n_in, n_saved + n_in + len(self.outputs)))
            got = (vjp, positions)
            with self._lock:
                self._argument_plans[id(vjp)] = got
        residuals, inputs, heads = list(residuals), list(inputs), list(heads)
        if (len(residuals), len(inputs), len(heads)) != (len(self.vjp.saved), len(self.inputs), len(self.outputs)):
            return self._pick_arguments(vjp, residuals, inputs, heads)  # its own message for a wrong count
        values = residuals + inputs + heads
        return [values[k] for k in got[1]]

    def _pick_arguments(self, vjp, residuals, inputs, heads) -> list:
        by_tensor = {id(t): r for t, r in zip(self.vjp.saved, residuals)}
        return vjp.backward_arguments([by_tensor[id(t)] for t in vjp.saved], inputs, heads)

    @staticmethod
    def spread(grads: Sequence, needs: Sequence[bool]) -> tuple:
        """One entry per input: the next of ``grads`` where ``needs``, else ``None``."""
        got = iter(grads)
        return tuple(next(got) if n else None for n in needs)


class FrontendOp:
    """A te_grad op ``fn`` as seen by a framework: its tensor arguments (``names``) and
    attributes (``attrs``), and a :class:`Spec` per combination of input shapes and dtypes,
    at most ``max_shapes`` of them kept (least recently used dropped first).

    A frontend sets :attr:`framework`, :attr:`noun` and :attr:`dtypes`, defines
    :meth:`shape_dtype` (and, if it likes, :meth:`fast_key`) and registers the op with its
    framework; ``label`` names the op in messages (default: ``fn``'s name)."""

    #: the framework's name, in messages
    framework = "the framework"
    #: what the framework's arrays are called, in messages
    noun = "arrays"
    #: ``{framework dtype: te_grad dtype}`` (:func:`dtype_table`); keys are shown in messages
    dtypes: Dict[Hashable, str] = {name: name for name in FRONTEND_DTYPES}

    def __init__(self, fn: Callable, save=None, threads: Optional[int] = None, max_shapes: int = MAX_SHAPES,
                 label: Optional[str] = None, dynamic_dims=None, **attrs):
        self.fn = fn
        self.label = label if label is not None else getattr(fn, "__name__", "the op")
        self.names, defaults = tensor_params(fn)
        fn_name = getattr(fn, "__name__", None)
        self.attrs = check_attrs(fn, defaults, attrs, where="" if self.label == fn_name else f"{self.label}: ")
        self.save = save
        self.threads = threads
        self._specs = SpecCache(max_shapes, on_evict=self._forget)
        self._seen: Dict[Hashable, Spec] = {}  # fast keys (the framework's own shape objects) -> spec
        self._last: Optional[tuple] = None  # (fast key, spec) of the most recent exact call (recent())
        where = "" if self.label == fn_name else f"{self.label}: "
        #: per argument index: its dynamic dimensions (declared, or seen symbolic since)
        self.dynamic: Dict[int, frozenset] = check_dynamic_dims(dynamic_dims, self.names, where)
        #: why the op last fell back to exact kernels (``fn`` or its kernels failed on size variables)
        self.static_reason: Optional[str] = None
        self._failed: set = set()  # symbolic keys that fell back: their calls get exact keys

    @property
    def max_shapes(self) -> int:
        """How many combinations of input shapes and dtypes the op keeps built."""
        return self._specs.size

    @max_shapes.setter
    def max_shapes(self, value: int):
        self._specs.size = value

    # -- what a frontend defines -------------------------------------------------------------
    def shape_dtype(self, name: str, value) -> Tuple[tuple, Hashable]:
        """``(shape, framework dtype)`` of the argument ``name`` (a :class:`UserError` if it is
        not one of the framework's arrays, or not where te_grad's kernels can read it)."""
        raise NotImplementedError

    def fast_key(self, args) -> Optional[Hashable]:
        """A cheap key of the arguments' shapes and dtypes (``None``: no fast path); a key seen
        before gives the spec of its first call without reading the arguments again."""
        return None

    def symbolic_size(self, n) -> Optional[Hashable]:
        """For an extent that is one of the framework's symbolic sizes (``torch.SymInt``), a
        key equal for equal sizes (its expression); ``None`` for a concrete extent."""
        return None

    # -- shared ------------------------------------------------------------------------------
    def check_arity(self, args) -> None:
        if len(args) != len(self.names):
            raise UserError(f"{self.label} takes {len(self.names)} {self.noun} ({', '.join(self.names)}), "
                            f"got {len(args)}")

    def key(self, args) -> tuple:
        """``((shape, te_grad dtype), ...)``, one per tensor argument; a dynamic extent is the
        name of its size variable (see the module docstring)."""
        return self.signature(args)[0]

    def signature(self, args, exact: bool = False) -> Tuple[tuple, NamedSizes]:
        """The key of a call (:meth:`key`) and the values of its size variables, by name;
        ``exact``: every extent as an int (a symbolic size is specialized)."""
        key, by_name, groups = [], {}, {}
        learned = False
        for i, (name, a) in enumerate(zip(self.names, args)):
            shape, native = self.shape_dtype(name, a)
            dt = self.dtypes.get(native)
            if dt is None:
                raise UserError(f"argument {name} has dtype {native}; te_grad supports "
                                f"{', '.join(str(d) for d in self.dtypes)}")
            declared = self.dynamic.get(i, frozenset())
            if declared and max(declared) >= len(shape):
                raise UserError(f"{self.label}: dynamic_dims names dimension {max(declared)} of {name}, which "
                                f"has {len(shape)} dimensions")
            pattern = []
            for d, n in enumerate(shape):
                group = self.symbolic_size(n)
                if exact or (group is None and d not in declared):
                    pattern.append(int(n))  # exact (a symbolic size is specialized: one build per shape)
                    continue
                if d not in declared:  # the framework made it symbolic: keep it dynamic from now on
                    self.dynamic[i] = declared = declared | {d}
                    learned = True
                var = groups.setdefault(("int", int(n)) if group is None else ("sym", group), f"{name}_{d}")
                by_name.setdefault(var, n)
                pattern.append(var)
            key.append((tuple(pattern), dt))
        if learned:
            self._seen.clear()  # fast keys of exact specs no longer stand for these shapes
            self._last = None
        return tuple(key), NamedSizes(by_name)

    def make_spec(self, key: tuple) -> Spec:
        return Spec(self.fn, self.names, self.attrs, key, self.save, self.threads,
                    accepts=set(self.dtypes.values()), framework=self.framework)

    def spec(self, *args) -> Spec:
        """The te_grad graph and kernels for the shapes and dtypes of ``args``."""
        return self.bind(*args)[0]

    def bind(self, *args) -> Tuple[Spec, NamedSizes]:
        """The spec for ``args`` (:meth:`spec`) and the values of its size variables, by name
        (empty for an exact spec). A symbolic spec has its VJP kernels built here: if ``fn``
        or they fail on size variables, the op falls back to exact specs (see the module
        docstring)."""
        try:
            fast = self.fast_key(args)
            spec = self._seen.get(fast) if fast is not None else None
        except (AttributeError, TypeError):  # not arrays, or symbolic sizes: signature() reads them
            fast = spec = None
        if spec is not None and not spec.symbolic:
            key, sizes = spec.key, NO_SIZES
        else:
            key, sizes = self.signature(args)
            if key in self._failed:
                key, sizes = self.signature(args, exact=True)
        try:
            with self._specs.lock:  # refreshed in the LRU order (or made); the fast key points to it
                spec = self._specs.get(key, lambda: self.make_spec(key))
                if fast is not None:
                    self._seen[fast] = spec
                    # the most recent call: the same fast key next finds this spec, already first in the LRU order
                    self._last = (fast, spec) if not spec.symbolic else None
            if spec.symbolic:
                spec.vjp  # noqa: B018 - built now, so a failure on size variables falls back here
        except Exception as e:  # noqa: BLE001 - any failure on size variables: exact kernels instead
            if not any(isinstance(e, str) for shape, _ in key for e in shape):
                raise
            self._specs.discard(key)
            self._failed.add(key)
            self.static_reason = f"{type(e).__name__}: {e}"
            self._seen.clear()
            self._last = None
            warnings.warn(f"{self.label}: cannot build on size variables ({self.static_reason}); building "
                          "exact kernels per shape instead", RuntimeWarning, stacklevel=2)
            return self.bind(*args)
        return spec, sizes

    def recent(self, args, fast=None) -> Optional[Spec]:
        """The spec of the op's most recent call when ``args`` have its fast key (``fast``,
        when the caller has it) and it was exact (no size variables): :meth:`bind` without its
        LRU bookkeeping, which that call did. ``None`` otherwise (then :meth:`bind`)."""
        last = self._last
        if last is None:
            return None
        if fast is None:
            try:
                fast = self.fast_key(args)
            except (AttributeError, TypeError):  # not arrays: bind() says what is wrong
                return None
        return last[1] if fast is not None and fast == last[0] else None

    def _forget(self, spec: Spec):
        self._last = None
        for k in [k for k, v in list(self._seen.items()) if v is spec]:
            self._seen.pop(k, None)
