"""Command line.

``python -m te_grad demo``: a strided conv2d, differentiated, simplified, compiled,
checked against finite differences and timed.
``python -m te_grad show OP [--param k=v ...] [--compile]``: any te_grad.nn op's formulas,
simplified gradients, exact iteration counts and (compiled) loop nests.
``python -m te_grad bench [--ops ...] [--threads N] [--quick]``: te_grad against PyTorch
and JAX on the reference suite (see te_grad/tools/benchmark.py).
``python -m te_grad fuzz --programs N --seed S``: random programs, every stage checked
against the others (see te_grad/tools/fuzz); with ``--torch``, random ``torch.nn.Module`` s
through the PyTorch importer against PyTorch.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import sys
import time

import numpy as np


def demo(out=None) -> int:
    """Differentiate a strided, padded conv2d: formulas raw and simplified, exact counts,
    compiled kernels checked against finite differences, and their speed."""
    out = sys.stdout if out is None else out
    import te_grad as tg
    from te_grad.testing import check_gradients

    def say(*args):
        print(*args, file=out)

    X = tg.placeholder((4, 32, 32, 32), name="X")
    W = tg.placeholder((32, 32, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, stride=2, padding=1)
    say("# a strided, padded conv2d written as an index formula")
    say(tg.show(Y))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(X.shape).astype("float32")
    w = rng.standard_normal(W.shape).astype("float32")
    t0 = time.perf_counter()
    (y,) = tg.evaluate([Y], {X: x, W: w})
    say(f"\nevaluated with the numpy reference evaluator: output {y.shape} {y.dtype} "
        f"in {time.perf_counter() - t0:.3f} s, sum {float(y.sum()):.4f}")

    say("\n# its gradient (vector-Jacobian product), derived automatically and simplified by isl")
    t0 = time.perf_counter()
    dY = tg.placeholder(Y.shape, name="dY")
    res = tg.differentiate(Y, [X, W], head=dY)
    t_diff = time.perf_counter() - t0
    raw = tg.differentiate(Y, [X, W], head=dY, simplify=False)
    say(tg.show(res[0]).splitlines()[-1])
    fwd, n_raw, n_simp = tg.iterations(Y), tg.iterations(list(raw)), tg.iterations(list(res))
    say(f"\ninnermost iterations (exact): forward {fwd:,}; raw VJP {n_raw:,}; simplified {n_simp:,} "
        f"({n_simp / fwd:.2f}x the forward, {n_raw / n_simp:,.0f}x fewer than raw; "
        f"derived and simplified in {t_diff:.2f} s)")

    raw_line = tg.show(raw[0]).splitlines()[-1]
    say(f"(the raw VJP it came from: {raw_line[:150]}{' ...' if len(raw_line) > 150 else ''})")

    say("\n# compiled with LLVM, checked against float64 finite differences on a small instance")
    Xs = tg.placeholder((1, 2, 7, 7), dtype="float64", name="X")
    Ws = tg.placeholder((3, 2, 3, 3), dtype="float64", name="W")
    Ys = tg.nn.conv2d(Xs, Ws, stride=2, padding=1)
    heads = tg.placeholder(Ys.shape, dtype="float64", name="head")
    grads_small = tg.gradient(Ys, [Xs, Ws], head=heads)
    small = tg.build(grads_small, inputs=[Xs, Ws, heads])
    feed = {Xs: rng.standard_normal(Xs.shape), Ws: rng.standard_normal(Ws.shape)}
    h = rng.standard_normal(Ys.shape)
    t0 = time.perf_counter()
    compiled = small(feed[Xs], feed[Ws], h)
    check_gradients(Ys, [Xs, Ws], feed, full_limit=0, directions=2, grads=grads_small, head=heads,
                    head_value=h, values=compiled)
    say(f"compiled gradients match central finite differences ({time.perf_counter() - t0:.2f} s)")

    t0 = time.perf_counter()
    fwd = tg.build([Y], inputs=[X, W])
    bwd = tg.build(list(res), inputs=[X, W, dY])
    say(f"built the forward and backward kernels in {time.perf_counter() - t0:.2f} s")
    dy = rng.standard_normal(Y.shape).astype("float32")
    dx, dw = bwd(x, w, dy)
    ref_dx = tg.evaluate([res[0]], {X: x, W: w, dY: dy})[0]
    err = float(np.abs(dx - ref_dx).max() / np.abs(ref_dx).max())
    say(f"compiled dX agrees with the reference evaluator (max relative error {err:.1e})")
    t_f, t_b = _median_ms(lambda: fwd(x, w)), _median_ms(lambda: bwd(x, w, dy))
    say(f"forward {t_f:.2f} ms, backward (dX and dW) {t_b:.2f} ms: {t_b / t_f:.2f}x the forward "
        f"({fwd.threads} threads; kernel loops: print(kernel.loops))")
    return 0


# -- show: any te_grad.nn op, its gradients and their cost ----------------------------------
class _Args:
    """The placeholders of one op instance: ``--param NAME=(shape)`` overrides a default shape."""

    def __init__(self, params: dict):
        self.params = dict(params)
        self.floats, self.data = [], []

    def x(self, name, shape, dtype="float32"):
        import te_grad as tg
        shape = self.params.pop(name, shape)
        if isinstance(shape, int) and not isinstance(shape, bool):
            shape = (shape,)
        if not (isinstance(shape, (tuple, list)) and all(isinstance(s, int) and not isinstance(s, bool)
                                                           and s >= 1 for s in shape)):
            raise _ShowError(f"the shape of input {name} must be a tuple of positive ints, got {shape!r}")
        t = tg.placeholder(tuple(shape), dtype=dtype, name=name)
        (self.floats if dtype.startswith("float") else self.data).append(t)
        return t

    def flag(self, name, default=False) -> bool:
        v = self.params.pop(name, default)
        if not isinstance(v, bool):
            raise _ShowError(f"--param {name}= takes True or False (whether to give the op a {name} "
                             f"tensor), got {v!r}")
        return v

    def get(self, name, default):
        return self.params.get(name, default)


class _ShowError(Exception):
    pass


def _nn():
    import te_grad as tg
    return tg.nn


def _b_dense(a):
    X, W = a.x("X", (8, 16)), a.x("W", (4, 16))
    bias = a.x("b", (W.shape[0],)) if a.flag("bias") else None
    return _nn().dense(X, W, bias=bias, **a.params)


def _b_matmul(a):
    A = a.x("A", (16, 8) if a.get("transpose_a", False) else (8, 16))
    B = a.x("B", (4, 16) if a.get("transpose_b", False) else (16, 4))
    return _nn().matmul(A, B, **a.params)


def _b_batch_matmul(a):
    A = a.x("A", (2, 8, 16))
    B = a.x("B", (2, 4, 16) if a.get("transpose_b", False) else (2, 16, 4))
    return _nn().batch_matmul(A, B, **a.params)


def _groups(a, channels=4):
    g = a.get("groups", 1)
    return g if isinstance(g, int) and g >= 1 and channels % g == 0 else 1


def _b_conv2d(a):
    X = a.x("X", (1, 4, 8, 8))
    W = a.x("W", (4, 4 // _groups(a), 3, 3))
    bias = a.x("b", (W.shape[0],)) if a.flag("bias") else None
    return _nn().conv2d(X, W, bias=bias, **a.params)


def _b_conv1d(a):
    X = a.x("X", (1, 4, 16))
    W = a.x("W", (4, 4 // _groups(a), 3))
    bias = a.x("b", (W.shape[0],)) if a.flag("bias") else None
    return _nn().conv1d(X, W, bias=bias, **a.params)


def _b_conv2d_transpose(a):
    X = a.x("X", (1, 4, 5, 5))
    W = a.x("W", (4, 4 // _groups(a), 3, 3))
    bias = a.x("b", (W.shape[1] * _groups(a),)) if a.flag("bias") else None
    return _nn().conv2d_transpose(X, W, bias=bias, **a.params)


def _b_pool(name):
    def build(a):
        a.params.setdefault("kernel", 2)
        return getattr(_nn(), name)(a.x("X", (1, 2, 8, 8)), **a.params)
    return build


def _b_unary(name, shape):
    def build(a):
        return getattr(_nn(), name)(a.x("X", shape), **a.params)
    return build


def _b_binary(name):
    def build(a):
        return getattr(_nn(), name)(a.x("A", (4, 3)), a.x("B", (3,)), **a.params)
    return build


def _b_layer_norm(a):
    X = a.x("X", (4, 8))
    axis = a.get("axis", -1)
    m = len(axis) if isinstance(axis, (tuple, list)) and axis else 1
    pshape = X.shape[-m:] if m <= X.ndim else X.shape
    gamma = a.x("gamma", pshape) if a.flag("gamma", True) else None
    beta = a.x("beta", pshape) if a.flag("beta", True) else None
    return _nn().layer_norm(X, gamma, beta, **a.params)


def _b_batch_norm(a):
    X = a.x("X", (4, 3, 4, 4))
    c = X.shape[1] if X.ndim > 1 else 1
    gamma = a.x("gamma", (c,)) if a.flag("gamma", True) else None
    beta = a.x("beta", (c,)) if a.flag("beta", True) else None
    return _nn().batch_norm(X, gamma, beta, **a.params)


def _b_rms_norm(a):
    X = a.x("X", (4, 8))
    axis = a.get("axis", -1)
    m = len(axis) if isinstance(axis, (tuple, list)) and axis else 1
    weight = a.x("weight", X.shape[-m:] if m <= X.ndim else X.shape) if a.flag("weight", True) else None
    return _nn().rms_norm(X, weight, **a.params)


def _b_swiglu(a):
    return _nn().swiglu(a.x("gate", (4, 8)), a.x("up", (4, 8)), **a.params)


def _b_attention(a):
    q = a.x("Q", (2, 4, 8))
    k = a.x("K", (q.shape[0], 6, q.shape[-1]))
    v = a.x("V", (q.shape[0], k.shape[1], 8))
    return _nn().scaled_dot_product_attention(q, k, v, **a.params)


def _b_chunk(a):
    a.params.setdefault("chunks", 3)
    return _nn().chunk(a.x("X", (7, 4)), **a.params)


def _b_reshape(a):
    a.params.setdefault("newshape", (3, 8))
    return _nn().reshape(a.x("X", (4, 6)), **a.params)


def _b_concat(a):
    A = a.x("A", (2, 3))
    axis = a.get("axis", 0)
    shape = list(A.shape)
    if isinstance(axis, int) and -len(shape) <= axis < len(shape):
        shape[axis] += 2
    B = a.x("B", tuple(shape))
    return _nn().concat([A, B], **a.params)


def _b_split(a):
    a.params.setdefault("indices_or_sections", 2)
    return _nn().split(a.x("X", (6, 4)), **a.params)


def _b_pad(a):
    a.params.setdefault("pad_width", 1)
    return _nn().pad(a.x("X", (3, 4)), **a.params)


def _b_strided_slice(a):
    for k, v in (("begin", (1, 0)), ("end", (7, 6)), ("strides", (2, 1))):
        a.params.setdefault(k, v)
    return _nn().strided_slice(a.x("X", (8, 6)), **a.params)


def _b_bias_add(a):
    X = a.x("X", (2, 3, 4, 4))
    axis = a.get("axis", 1)
    n = X.shape[axis] if isinstance(axis, int) and -X.ndim <= axis < X.ndim else X.shape[1]
    return _nn().bias_add(X, a.x("b", (n,)), **a.params)


def _b_embedding(a):
    return _nn().embedding(a.x("table", (10, 4)), a.x("ids", (6,), "int64"), **a.params)


def _b_take(a):
    return _nn().take(a.x("X", (5, 4)), a.x("indices", (3,), "int64"), **a.params)


def _b_loss(name, second):
    def build(a):
        return getattr(_nn(), name)(a.x(second[0], (4, 3)), a.x(second[1], (4, 3)), **a.params)
    return build


def _b_softmax_cross_entropy(a):
    return _nn().softmax_cross_entropy(a.x("logits", (4, 5)), a.x("labels", (4,), "int64"),
                                       **a.params)


def _b_cross_entropy(a):
    return _nn().cross_entropy(a.x("logits", (4, 5)), a.x("target", (4, 5)), **a.params)


def _b_stack(a):
    return _nn().stack([a.x("A", (3, 4)), a.x("B", (3, 4))], **a.params)


def _b_where(a):
    return _nn().where(a.x("cond", (3, 4), "bool"), a.x("A", (3, 4)), a.x("B", (3, 4)), **a.params)


def _b_one_hot(a):
    params = dict(depth=5, **a.params)
    return _nn().one_hot(a.x("ids", (4,), "int64"), **params)


def _b_gather_nd(a):
    return _nn().gather_nd(a.x("X", (4, 5, 3)), a.x("indices", (6, 2), "int64"), **a.params)


def _b_expand_dims(a):
    params = dict(axis=1, **a.params)
    return _nn().expand_dims(a.x("X", (3, 4)), **params)


def _b_clip(a):
    params = dict(lo=-0.5, hi=0.5, **a.params)
    return _nn().clip(a.x("X", (3, 4)), **params)


def _b_arange(a):
    params = dict(n=6, **a.params)
    return _nn().arange(**params)


def _b_segment(name, shape):
    def build(a):
        return getattr(_nn(), name)(a.x("X", shape), a.x("rowptr", (4,), "int64"), **a.params)
    return build


#: every te_grad.nn op by name: (family, builder with small default shapes)
SHOW_OPS = {
    "dense": ("linear algebra", _b_dense),
    "matmul": ("linear algebra", _b_matmul),
    "batch_matmul": ("linear algebra", _b_batch_matmul),
    "conv1d": ("convolution and pooling", _b_conv1d),
    "conv2d": ("convolution and pooling", _b_conv2d),
    "conv2d_transpose": ("convolution and pooling", _b_conv2d_transpose),
    "max_pool2d": ("convolution and pooling", _b_pool("max_pool2d")),
    "avg_pool2d": ("convolution and pooling", _b_pool("avg_pool2d")),
    "global_avg_pool2d": ("convolution and pooling", _b_unary("global_avg_pool2d", (1, 2, 4, 4))),
    "global_max_pool2d": ("convolution and pooling", _b_unary("global_max_pool2d", (1, 2, 4, 4))),
    "relu": ("activations", _b_unary("relu", (4, 8))),
    "leaky_relu": ("activations", _b_unary("leaky_relu", (4, 8))),
    "sigmoid": ("activations", _b_unary("sigmoid", (4, 8))),
    "tanh": ("activations", _b_unary("tanh", (4, 8))),
    "gelu": ("activations", _b_unary("gelu", (4, 8))),
    "silu": ("activations", _b_unary("silu", (4, 8))),
    "swiglu": ("activations", _b_swiglu),
    "softmax": ("activations", _b_unary("softmax", (4, 8))),
    "log_softmax": ("activations", _b_unary("log_softmax", (4, 8))),
    "scaled_dot_product_attention": ("attention", _b_attention),
    "layer_norm": ("normalization", _b_layer_norm),
    "rms_norm": ("normalization", _b_rms_norm),
    "batch_norm": ("normalization", _b_batch_norm),
    "reshape": ("layout", _b_reshape),
    "flatten": ("layout", _b_unary("flatten", (2, 3, 4))),
    "transpose": ("layout", _b_unary("transpose", (2, 3, 4))),
    "concat": ("layout", _b_concat),
    "split": ("layout", _b_split),
    "chunk": ("layout", _b_chunk),
    "pad": ("layout", _b_pad),
    "strided_slice": ("layout", _b_strided_slice),
    "add": ("broadcast arithmetic", _b_binary("add")),
    "subtract": ("broadcast arithmetic", _b_binary("subtract")),
    "multiply": ("broadcast arithmetic", _b_binary("multiply")),
    "divide": ("broadcast arithmetic", _b_binary("divide")),
    "maximum": ("broadcast arithmetic", _b_binary("maximum")),
    "minimum": ("broadcast arithmetic", _b_binary("minimum")),
    "power": ("broadcast arithmetic", _b_binary("power")),
    "bias_add": ("broadcast arithmetic", _b_bias_add),
    "embedding": ("gathers and losses", _b_embedding),
    "take": ("gathers and losses", _b_take),
    "mse_loss": ("gathers and losses", _b_loss("mse_loss", ("pred", "target"))),
    "binary_cross_entropy": ("gathers and losses", _b_loss("binary_cross_entropy", ("prob", "target"))),
    "softmax_cross_entropy": ("gathers and losses", _b_softmax_cross_entropy),
    "cross_entropy": ("gathers and losses", _b_cross_entropy),
    "sum": ("reductions", _b_unary("sum", (3, 4))),
    "mean": ("reductions", _b_unary("mean", (3, 4))),
    "variance": ("reductions", _b_unary("variance", (3, 4))),
    "max": ("reductions", _b_unary("max", (3, 4))),
    "min": ("reductions", _b_unary("min", (3, 4))),
    "argmax": ("reductions", lambda a: _nn().argmax(a.x("X", (3, 4)), **{"axis": 1, **a.params})),
    "argmin": ("reductions", lambda a: _nn().argmin(a.x("X", (3, 4)), **{"axis": 1, **a.params})),
    "clip": ("array", _b_clip),
    "stack": ("array", _b_stack),
    "expand_dims": ("array", _b_expand_dims),
    "squeeze": ("array", _b_unary("squeeze", (3, 1, 4))),
    "where": ("array", _b_where),
    "one_hot": ("array", _b_one_hot),
    "gather_nd": ("array", _b_gather_nd),
    "cumsum": ("array", _b_unary("cumsum", (3, 4))),
    "arange": ("array", _b_arange),
    "segment_sum": ("segments (CSR)", _b_segment("segment_sum", (6, 3))),
    "segment_max": ("segments (CSR)", _b_segment("segment_max", (6, 3))),
    "segment_softmax": ("segments (CSR)", _b_segment("segment_softmax", (6,))),
}


def known_ops() -> str:
    """The op names ``show`` knows, by family, one family a line."""
    families = {}
    for name, (family, _) in SHOW_OPS.items():
        families.setdefault(family, []).append(name)
    return "\n".join(f"  {fam}: {', '.join(names)}" for fam, names in families.items())


def parse_params(items) -> dict:
    """``["stride=2", "padding=(1, 0)"]`` -> ``{"stride": 2, "padding": (1, 0)}`` (Python literals)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise _ShowError(f"--param takes NAME=VALUE (e.g. --param stride=2), got {item!r}")
        try:
            out[key] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise _ShowError(f"--param {key}: {value!r} is not a Python literal (write e.g. 2, (1, 2), "
                             f"True, 0.5 or 'name')") from None
        if isinstance(out[key], list):
            out[key] = tuple(out[key])
    return out


def _call_text(op, args: _Args) -> str:
    parts = [t.name for t in args.floats + args.data]
    parts += [f"{k}={v!r}" for k, v in args.params.items()]
    return f"{op}({', '.join(parts)})"


def _build_op(op: str, params: dict):
    import te_grad as tg
    family, builder = SHOW_OPS[op]
    args = _Args(params)
    try:
        out = builder(args)
    except TypeError as err:
        fn = getattr(tg.nn, op)
        sig = [p.name for p in inspect.signature(fn).parameters.values()
               if p.default is not inspect.Parameter.empty]
        inputs = ", ".join(t.name for t in args.floats + args.data)
        raise _ShowError(f"{op}: bad parameter ({err}); its parameters are {', '.join(sig) or '(none)'}; "
                         f"the shapes of its inputs {inputs} can be set too (e.g. --param "
                         f"{(args.floats + args.data)[0].name}=(...))") from None
    except tg.UserError as err:
        raise _ShowError(str(err)) from None
    return out, args


def show_op(op: str, params: dict, compile_: bool = False, out=None) -> int:
    """Print ``op``'s forward formula, its simplified gradients and their exact iteration counts."""
    import te_grad as tg
    out = out if out is not None else sys.stdout

    def say(*a):
        print(*a, file=out)

    result, args = _build_op(op, params)
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    say(f"# {_call_text(op, args)}")
    say("\n## forward")
    fwd_text = tg.show(outputs)
    say(fwd_text)
    if not args.floats or not any(tg.dtypes.is_float(o.dtype) for o in outputs):
        say("\n(no float input or output: nothing to differentiate)")
        return 0
    heads = [tg.placeholder(y.shape, dtype=y.dtype, name="dY" if len(outputs) == 1 else f"dY{n}")
             for n, y in enumerate(outputs)]
    t0 = time.perf_counter()
    res = tg.differentiate(outputs, args.floats, head=heads if len(heads) > 1 else heads[0])
    t_diff = time.perf_counter() - t0
    if len(heads) == 1:
        say(f"\n## gradients, simplified by isl (head {heads[0].name}: the adjoint of {outputs[0].name})")
    else:
        say(f"\n## gradients, simplified by isl (heads {', '.join(h.name for h in heads)}: the adjoints "
            "of the outputs, in order)")
    known = set(fwd_text.splitlines())
    say("\n".join(line for line in tg.show(list(res)).splitlines() if line not in known))
    say("\n## innermost iterations (exact)")
    try:
        tg.iterations(outputs)
        ragged = None
    except tg.UserError:  # a ragged loop: its trips are read from data
        ragged = 4
        say(f"(a ragged loop's trips depend on the data: each counts as {ragged} per point here)")
    say(f"{'':<12}{'raw VJP':>18}{'simplified':>14}{'raw / simplified':>19}")
    for x, g, raw in zip(res.inputs, res.gradients, res.raw):
        n_raw, n_simp = tg.iterations(raw, ragged=ragged), tg.iterations(g, ragged=ragged)
        ratio = f"{n_raw / n_simp:,.1f}x" if n_simp else "-"
        say(f"{'d' + x.name:<12}{n_raw:>18,}{n_simp:>14,}{ratio:>19}")
    n_raw, n_simp = tg.iterations(list(res.raw), ragged=ragged), tg.iterations(list(res.gradients), ragged=ragged)
    say(f"{'all':<12}{n_raw:>18,}{n_simp:>14,}{(f'{n_raw / n_simp:,.1f}x' if n_simp else '-'):>19}")
    say(f"{'forward':<12}{tg.iterations(outputs, ragged=ragged):>18,}")
    say(f"(differentiated and simplified in {t_diff:.2f} s)")
    if compile_:
        inputs = args.floats + args.data
        t0 = time.perf_counter()
        fwd = tg.build(outputs, inputs=inputs)
        bwd = tg.build(list(res), inputs=inputs + heads)
        say(f"\n## compiled kernels (LLVM, {time.perf_counter() - t0:.2f} s)")
        say(f"# forward: {', '.join(t.name for t in inputs)} -> {', '.join(y.name for y in outputs)}")
        say(fwd.loops)
        say(f"\n# backward: {', '.join(t.name for t in inputs + heads)} -> "
            f"{', '.join(g.name for g in res)}")
        say(bwd.loops)
    return 0


def _median_ms(fn, repeat: int = 20) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # its own options: python -m te_grad bench --help
        from te_grad.tools.benchmark import main as bench_main
        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m te_grad",
        description="te_grad: differentiate tensor expressions into exact, fast backward passes.",
        epilog="python -m te_grad COMMAND --help describes each command.")
    from te_grad import __version__
    parser.add_argument("--version", action="version", version=f"te_grad {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="differentiate a strided conv2d, compile it, check it, time it")
    sub.add_parser("bench", help="time te_grad against PyTorch and JAX on the reference suite "
                                 "(options: python -m te_grad bench --help)")
    p_show = sub.add_parser(
        "show", help="print a te_grad.nn op, its simplified gradients and their exact cost",
        description="Build a te_grad.nn op with small default shapes, print its forward formula, its "
                    "gradients simplified by isl and the exact iteration counts of the raw and the "
                    "simplified vector-Jacobian products.",
        epilog="ops:\n" + known_ops() + "\n\nexample: python -m te_grad show conv2d --param stride=2 "
               "--param padding=1 --compile",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p_show.add_argument("op", help="a te_grad.nn op name (listed below)")
    p_show.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="an op parameter as a Python literal (stride=2, padding=(1, 0)), or the "
                             "shape of an input by its name (X=(1, 2, 9, 9)); repeatable")
    p_show.add_argument("--compile", action="store_true",
                        help="also compile the forward and backward kernels and print their loops")
    p_fuzz = sub.add_parser(
        "fuzz", help="check random programs: raw gradients against finite differences, simplified "
                     "against raw, compiled against the evaluator",
        description="Generate random valid te_grad programs and check every stage against the others. "
                    "Prints the count of each outcome and every failing program, shrunk, as a script "
                    "that reproduces it. Exit status 1 if any program failed.")
    p_fuzz.add_argument("--programs", type=int, default=200, help="how many programs (default 200)")
    p_fuzz.add_argument("--seed", type=int, default=0, help="the seed of the program sequence (default 0)")
    p_fuzz.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p_fuzz.add_argument("--no-compile", action="store_true", help="skip the compiled kernels")
    p_fuzz.add_argument("--no-shrink", action="store_true", help="print failing programs as found")
    p_fuzz.add_argument("--torch", action="store_true",
                        help="random torch.nn.Modules through the PyTorch importer instead, forward, "
                             "gradients and an SGD step against PyTorch's (needs torch)")
    p_fuzz.add_argument("--dynamo", action="store_true",
                        help="with --torch, each module also through torch.compile with te_grad's "
                             "backend, at two batch sizes: outputs and gradients against PyTorch's")
    p_digits = sub.add_parser(
        "train-digits", help="train a small CNN on scikit-learn's 8x8 digits, next to the same model in PyTorch",
        description="Train Conv2d(1, 16, 3) -> ReLU -> MaxPool2d(2) -> Linear(256, 10) with Adam on 80% of "
                    "scikit-learn's handwritten digits, one native call per step, and report the test "
                    "accuracy; with PyTorch installed, train the same model from the same initial weights on "
                    "the same batches and compare the losses and the time per epoch.")
    p_digits.add_argument("--epochs", type=int, default=10)
    p_digits.add_argument("--lr", type=float, default=1e-2)
    p_digits.add_argument("--batch", type=int, default=64)
    p_digits.add_argument("--threads", type=int, default=None, help="threads for te_grad and PyTorch")
    p_digits.add_argument("--no-torch", action="store_true", help="do not train the PyTorch twin")
    p_digits.add_argument("--plot", metavar="PNG", help="draw the two loss curves into PNG")
    from te_grad.tools import import_check
    import_check.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "import-check":
        return import_check.main(args)
    if args.command == "train-digits":
        from te_grad.train.digits import run
        run(args.epochs, args.lr, args.batch, threads=args.threads, compare=not args.no_torch, plot=args.plot)
        return 0
    if args.command == "fuzz" and args.torch:
        from te_grad.tools.fuzz.torch_check import PASSING, run
        result = run(args.programs, args.seed, compile_=not args.no_compile, dynamo=args.dynamo,
                     progress_every=max(1, min(100, args.programs // 10)))
        return 1 if any(k not in PASSING for k in result["counts"]) else 0
    if args.command == "fuzz":
        from te_grad.tools.fuzz import PASSING, run
        counts = run(args.programs, args.seed, compile_=not args.no_compile,
                     shrink_failures=not args.no_shrink, jobs=args.jobs,
                     progress_every=max(1, min(100, args.programs // 10)))
        return 1 if any(k not in PASSING for k in counts) else 0
    if args.command == "demo":
        return demo()
    if args.command == "show":
        if args.op not in SHOW_OPS:
            print(f"error: unknown op {args.op!r}; known ops:\n{known_ops()}", file=sys.stderr)
            return 2
        try:
            return show_op(args.op, parse_params(args.param), args.compile)
        except _ShowError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 2

