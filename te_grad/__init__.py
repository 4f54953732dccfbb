"""te_grad: differentiate tensor expressions into fast, exact backward passes.

The public API (see README.md and docs/API.md; the design is in docs/SIMPLIFIER.md,
docs/CODEGEN.md and docs/EXPORT.md): build ops with
:func:`placeholder`, :func:`compute`, :func:`reduce_axis` and the scalar
functions; evaluate them with :func:`evaluate`; print them with :func:`show`.
"""
from . import dtypes
from .errors import InternalError, SimplificationWarning, TeGradError, UserError
from .ir import Expr, Tensor
from .dsl import (abs, acos, all, any, asin, atan, atan2, call, cast, ceil, compute, const, cos, erf,
                  exp, expm1, floor, if_then_else, log, log1p, logical_not, max, maximum, min, minimum,
                  placeholder, pow, prod, reduce_axis, round, sigmoid, sin, sqrt, stop_gradient, sum,
                  tanh, trunc)
from .dsl import argmax, argmin
from .evaluator import evaluate
from .printer import show
from .autodiff import DifferentiationResult, differentiate, gradient
from .autodiff.rows import RowGradient, row_gradient
from . import nn
from .deep import deep_entry
from .verify import verify
from .sizes import var


@deep_entry
def simplify(tensors):
    """Exact, cheaper equivalents of ``tensors`` (isl): see the ``simplify`` package."""
    from simplify import simplify as _simplify
    return _simplify(tensors)


@deep_entry
def build(outputs, inputs, **options):
    """Compile ``outputs`` (functions of the placeholders ``inputs``) to a native kernel (LLVM).

    ``kern = tg.build([Y, dX], inputs=[X, W]); y, dx = kern(x, w)``: a ``codegen.Kernel``
    (its call convention, ``loops``, ``export`` and ``profile`` are under ``codegen`` in
    docs/API.md). The keyword ``options`` are those of ``codegen.build``, documented there
    too: ``options=`` (a ``codegen.options.CompileOptions`` holding every setting; default:
    the options in force, ``with codegen.options.compile_options(...)`` or the environment),
    and keywords overriding its fields: ``fast_math`` (default True), ``threads`` (default:
    the CPUs, or ``TE_GRAD_NUM_THREADS``), ``machine`` (the vector width and caches the loops
    are sized for), ``disabled_passes`` (schedule passes to skip, by name), ``thresholds``,
    ``verify``...; and ``wait`` (False: compile in the background).
    """
    from codegen import build as _build
    return _build(outputs, inputs, **options)


@deep_entry
def export(path: str, entries, target: str = "host", *, cpu: str = None, features: str = None,
           shared: bool = False, threads: int = 1, constants=None):
    """Several compiled kernels as entry points of one object file ``path.o`` with a C header
    ``path.h`` (``Kernel.export`` writes one). ``entries`` maps each entry point's name to
    ``(kernel, args)``, ``args`` listing its C arguments in order: a tensor of the kernel (a
    pointer to its buffer), ``("buffer", name, tensor)`` (the same, named ``name`` in C),
    ``("scalar", tensor)`` (a 0-d input by value), or ``("group", name,
    [(tensor, byte offset), ...], is_output, total bytes)`` (one blob holding several buffers);
    a ``"buffer"`` or ``"scalar"`` tuple may end with a text saying what the argument means,
    and a ``"group"`` tuple with one after the total bytes: the header prints it. Entry point
    and constant names must be C identifiers that are no C keyword or reserved name and
    collide with nothing the header declares (a :class:`UserError` otherwise).
    ``constants`` (name -> array) become global ``const`` arrays. See docs/EXPORT.md."""
    from codegen.export import Arg, Entry, c_name
    from codegen.export import export as _export
    built = []
    for name, (kernel, args) in entries.items():
        outputs = {id(t) for t in kernel.outputs}
        spec = []
        for a in args:
            if isinstance(a, Tensor):
                spec.append(Arg(c_name(a.name), "buffer", a, id(a) in outputs))
            elif a[0] == "buffer" and len(a) in (3, 4):
                spec.append(Arg(c_name(a[1]), "buffer", a[2], id(a[2]) in outputs, doc=_arg_doc(a, 3)))
            elif a[0] == "scalar" and len(a) in (2, 3):
                spec.append(Arg(c_name(a[1].name), "scalar", a[1], doc=_arg_doc(a, 2)))
            elif a[0] == "group" and len(a) in (5, 6):
                gname, members, is_output, size = a[1:5]
                spec.append(Arg(c_name(gname), "group", output=is_output, members=list(members), size=size,
                                doc=_arg_doc(a, 5)))
            else:
                raise UserError(f"tg.export: cannot use {a!r} as an argument of {name}")
        built.append(Entry(c_name(name), kernel, spec))
    return _export(built, path, target, cpu=cpu, features=features, shared=shared, threads=threads,
                   constants=constants)


def _arg_doc(spec, at: int) -> str:
    doc = spec[at] if len(spec) > at else ""
    if not isinstance(doc, str):
        raise UserError(f"tg.export: the last element of {spec[0]!r} argument {spec!r} must be its "
                        f"description (a str)")
    return doc


def default_threads() -> int:
    """The threads a kernel uses unless told otherwise: ``TE_GRAD_NUM_THREADS``, else the CPUs
    this process may run on."""
    from codegen.kernel import default_threads as _default
    return _default()


def build_vjp(outputs, inputs, wrt=None, save=None, **options):
    """Forward and backward kernels sharing saved residuals (see :mod:`te_grad.residuals`).

    ``vjp = tg.build_vjp([Y], [X, W]); outs, res = vjp.run_forward(x, w)``, then
    ``dx, dw = vjp.run_backward(res, [x, w], [dy])``. ``save=None`` picks what to save from
    exact costs, ``save=[T, ...]`` forces it, ``save=[]`` recomputes everything;
    ``vjp.residual_bytes`` is the memory the residuals take."""
    from .residuals import build_vjp as _build_vjp
    return _build_vjp(outputs, inputs, wrt=wrt, save=save, **options)


@deep_entry
def domain(tensor):
    """The iteration domains (isl sets) of ``tensor``'s reductions, for inspection."""
    from simplify.domain import domains
    return domains(tensor)


def latex(tensors) -> str:
    """The formulas of ``tensors`` and their dependencies as LaTeX (sympy renders them)."""
    from .symbolic import latex as _latex
    return _latex(tensors)


@deep_entry
def iterations(tensors):
    """Exact innermost-loop iterations to compute ``tensors`` from placeholders, each op once.

    An int for fixed shapes; for a graph with size variables a ``SizeCount``, a function of
    the sizes: ``count.at(n=5)`` is exact, ``str(count)`` its closed form (``64 * n``), see
    :mod:`simplify.count`."""
    from simplify import iterations as _iterations
    return _iterations(tensors)

from .version import __version__  # noqa: E402 - one place for it
from . import display as _display  # noqa: E402
_display.install()  # the notebook forms (HTML, LaTeX) of tensors, results, kernels, domains

__all__ = [
    "TeGradError", "UserError", "InternalError", "Expr", "Tensor", "dtypes",
    "placeholder", "compute", "reduce_axis", "var", "sum", "prod", "max", "min",
    "argmax", "argmin",
    "const", "cast", "if_then_else", "all", "any", "logical_not", "call",
    "exp", "log", "sqrt", "tanh", "sigmoid", "abs", "sin", "cos", "erf", "pow",
    "asin", "acos", "atan", "atan2", "log1p", "expm1", "SimplificationWarning",
    "maximum", "minimum", "floor", "ceil", "trunc", "round", "stop_gradient",
    "evaluate", "show", "nn", "differentiate", "gradient", "DifferentiationResult",
    "simplify", "iterations", "build", "domain", "row_gradient", "RowGradient", "verify", "latex", "build_vjp", "default_threads", "export",
]
