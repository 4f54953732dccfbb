"""The schedule passes on stages whose extents are known only at run time (tg.var): each pass
runs as at fixed sizes over the int extents, the split batch axis in whole register blocks
plus a remainder nest; every schedule is checked by the loop interpreter against the oracle
at several sizes (the smallest allowed, sizes that leave a remainder, a multiple of the
blocks), and the native kernels too."""
import numpy as np
import pytest

import codegen
import te_grad as tg
from codegen.interpret import run
from codegen.loopir import RegisterBlocked, loops
from codegen.options import CompileOptions
from codegen.packing import EVERY_COPY
from codegen.schedule import optional_passes, stages_for

RNG = np.random.default_rng(11)
SIZES = (1, 3, 9, 16)  # 1: the least n; 3, 9: not multiples of the jam factors; 16: whole blocks


def dense(n):
    X, W = tg.placeholder((n, 8), name="X"), tg.placeholder((8, 12), name="W")
    B = tg.placeholder((12,), name="B")
    k = tg.reduce_axis(8, "k")
    return tg.compute((n, 12), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k) + B[j], name="Y"), [X, W, B]


def conv1d(n):
    X, W = tg.placeholder((n, 2, 9), name="X"), tg.placeholder((3, 2, 3), name="W")
    c, r = tg.reduce_axis(2, "c"), tg.reduce_axis(3, "r")
    return tg.compute((n, 3, 7), lambda b, o, t: tg.sum(X[b, c, t + r] * W[o, c, r], axis=[c, r]), name="Y"), [X, W]


def conv2d(n):
    X, W = tg.placeholder((n, 2, 5, 5), name="X"), tg.placeholder((3, 2, 3, 3), name="W")
    c, p, q = tg.reduce_axis(2, "c"), tg.reduce_axis(3, "p"), tg.reduce_axis(3, "q")
    return tg.compute((n, 3, 3, 3), lambda b, o, y, x: tg.sum(X[b, c, y + p, x + q] * W[o, c, p, q],
                                                            axis=[c, p, q]), name="Y"), [X, W]


def conv2d_tiny(n):
    """A padded stride-2 convolution of 4 x 4 images (ResNet-18's small layers): its forward
    and input gradient are cut into pieces and congruence classes along the image axes, the
    batch of run-time extent running whole in each."""
    X, W = tg.placeholder((n, 3, 4, 4), name="X"), tg.placeholder((4, 3, 3, 3), name="W")
    return tg.nn.conv2d(X, W, stride=2, padding=1), [X, W]


def softmax(n):
    X = tg.placeholder((n, 10), name="X")
    r, s = tg.reduce_axis(10, "r"), tg.reduce_axis(10, "s")
    M = tg.compute((n,), lambda i: tg.max(X[i, r], axis=r), name="M")
    E = tg.compute((n, 10), lambda i, j: tg.exp(X[i, j] - M[i]), name="E")
    S = tg.compute((n,), lambda i: tg.sum(E[i, s], axis=s), name="S")
    return tg.compute((n, 10), lambda i, j: E[i, j] / S[i], name="Y"), [X]


def layer_norm(n):
    X = tg.placeholder((n, 12), name="X")
    G, B = tg.placeholder((12,), name="G"), tg.placeholder((12,), name="B")
    r, s = tg.reduce_axis(12, "r"), tg.reduce_axis(12, "s")
    mean = tg.compute((n,), lambda i: tg.sum(X[i, r], axis=r) / 12.0, name="mean")
    var = tg.compute((n,), lambda i: tg.sum((X[i, s] - mean[i]) * (X[i, s] - mean[i]), axis=s) / 12.0, name="var")
    return tg.compute((n, 12), lambda i, j: (X[i, j] - mean[i]) / tg.sqrt(var[i] + 1e-5) * G[j] + B[j],
                      name="Y"), [X, G, B]


def inner_sizes(n):
    """Sizes inside too: a contraction over a reduce axis of run-time extent, a convolution
    along a length ``n + 2`` and a max over rows of run-time length (no int extent to block
    on: the passes must leave those loops right, not fail)."""
    X, W = tg.placeholder((4, n), name="X"), tg.placeholder((n, 5), name="W")
    V, K = tg.placeholder((3, n + 2), name="V"), tg.placeholder((3,), name="K")
    k, r, q = tg.reduce_axis((0, n), "k"), tg.reduce_axis(3, "r"), tg.reduce_axis((0, n), "q")
    A = tg.compute((4, 5), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="A")
    C = tg.compute((3, n), lambda i, t: tg.sum(V[i, t + r] * K[r], axis=r), name="C")
    M = tg.compute((3,), lambda i: tg.max(C[i, q], axis=q), name="M")
    Y = tg.compute((4, 5), lambda i, j: A[i, j] + M[i % 3], name="Y")
    return Y, [X, W, V, K]


OPS = {"dense": dense, "conv1d": conv1d, "conv2d": conv2d, "conv2d_tiny": conv2d_tiny, "softmax": softmax, "layer_norm": layer_norm,
       "inner_sizes": inner_sizes}


def _graph(name, backward):
    n = tg.var("n", min=1)
    y, inputs = OPS[name](n)
    if not backward:
        return [y], inputs
    head = tg.placeholder(y.shape, name="H")
    return list(tg.gradient(y, inputs, head=head)), inputs + [head]


def _feed(inputs, size):
    from te_grad.sizes import concrete_shape, size_vars_in
    sizes = {v: size for t in inputs for d in t.shape if not isinstance(d, int) for v in size_vars_in(d)}
    return {t: RNG.standard_normal(concrete_shape(t.shape, sizes)).astype("float32") for t in inputs}


def _check(got, want, what):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())), err_msg=what)


CASES = [(name, bwd) for name in OPS for bwd in (False, True)]


@pytest.mark.parametrize("name,backward", CASES, ids=[f"{n}-{'bwd' if b else 'fwd'}" for n, b in CASES])
def test_each_pass_on_run_time_extents_keeps_the_values(name, backward):
    """The optional passes switched on one after another, in order: every prefix of the
    schedule, interpreted, computes the oracle's values at every size."""
    outs, inputs = _graph(name, backward)
    order = optional_passes()
    feeds = [_feed(inputs, size) for size in SIZES]
    wants = [tg.evaluate(outs, feed) for feed in feeds]
    for k in range(len(order) + 1):
        # every copy that packing may make, whatever its size
        stages = stages_for(outs, options=CompileOptions(disabled_passes=frozenset(order[k:]), thresholds=EVERY_COPY))
        # every size with all the passes; the least and one leaving a remainder for the others
        for feed, want in zip(feeds, wants) if k == len(order) else zip(feeds[::2], wants[::2]):
            values = run(stages, feed)
            shapes = [a.shape for a in feed.values()]
            _check([values[id(t)] for t in outs], want, f"{name} with the passes up to {order[:k][-1:]} at {shapes}")


@pytest.mark.parametrize("name,backward", CASES, ids=[f"{n}-{'bwd' if b else 'fwd'}" for n, b in CASES])
def test_native_symbolic_kernels_against_the_oracle(name, backward):
    outs, inputs = _graph(name, backward)
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(outs, inputs)
    for size in SIZES + (17,):
        feed = _feed(inputs, size)
        got = kern(*feed.values())
        _check(got if isinstance(got, tuple) else (got,), tg.evaluate(outs, feed), f"{name} at n={size}")


def test_the_batch_axis_is_jammed_in_whole_blocks_with_a_remainder():
    outs, inputs = _graph("dense", False)
    (stage,) = [s for s in stages_for(outs) if s.tensor is outs[0] and any(
        isinstance(lp.kind, RegisterBlocked) for lp in loops(s.body))]
    blocks = [lp for lp in loops(stage.body) if isinstance(lp.kind, RegisterBlocked)]
    # whole blocks of the split axis (jammed), then its last values one at a time
    assert len(blocks) == 2
    assert [j.var.name for j in blocks[0].kind.jams] == ["i"] and blocks[0].kind.jams[0].factor > 1
    assert not blocks[1].kind.jams
    split = [lp for lp in loops(stage.body) if lp.parallel]
    assert [lp.scale for lp in split] == [1, blocks[0].kind.jams[0].factor, 1]
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(outs, inputs)
    assert kern.loops.count("in vector registers") == 2


def test_a_convolution_gradient_reads_a_padded_copy_whole_along_the_batch():
    """The input gradient of a convolution reads the head from a zero-padded copy (padded in
    its int dimensions, the batch of run-time extent kept whole), so that its sum runs over
    constant bounds in register blocks, as at fixed sizes."""
    outs, inputs = _graph("conv1d", True)
    head = inputs[-1]
    stages = stages_for(outs, options=CompileOptions(thresholds=EVERY_COPY))
    (copy,) = [s.tensor for s in stages if s.tensor.name == "H_padded"]
    assert copy.shape[0] is head.shape[0] and copy.shape[1:] == (3, 7 + 2 * 2)
    (dx,) = [s for s in stages if s.tensor is outs[0]]
    assert any(isinstance(lp.kind, RegisterBlocked) for lp in loops(dx.body))


def test_a_select_over_reads_proven_for_every_size_is_evaluated_branch_free():
    """``if_then_else(X[i, j] == M[i], D[i] / M[i], 0)`` (a max's gradient): both sides are
    read in bounds for every n, so the symbolic kernel selects in vectors as the fixed-shape
    one does, instead of branching per element."""
    import re

    def build(n):
        X, M, D = tg.placeholder((n, 64), name="X"), tg.placeholder((n,), name="M"), tg.placeholder((n,), name="D")
        Y = tg.compute((n, 64), lambda i, j: X[i, j] * 2.0 + tg.if_then_else(X[i, j] == M[i], D[i] / M[i], 0.0),
                       name="Y")
        with codegen.compile_options(disk_cache=False):
            return tg.build(Y, [X, M, D]), Y, [X, M, D]

    def vector_selects(kern):
        return len(re.findall(r"select (?:fast )?<\d+ x i1>", kern.llvm_ir))

    kern, Y, inputs = build(tg.var("n", min=1))
    assert vector_selects(kern) == vector_selects(build(64)[0]) > 0
    for size in (1, 5):
        feed = _feed(inputs, size)
        x = feed[inputs[0]]
        feed[inputs[1]] = x.max(axis=1)  # some elements equal their row's maximum
        _check([kern(*feed.values())], tg.evaluate([Y], feed), f"n={size}")


def test_a_call_at_sizes_already_bound_makes_no_tensors_at_those_sizes(monkeypatch):
    """The per-call cost of a symbolic kernel: the inputs and outputs at the bound sizes (and
    the sizes' values) are made once per set of input shapes, not on every call."""
    from codegen import kernel as kernel_module
    outs, inputs = _graph("softmax", False)
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(outs, inputs)
    feed = _feed(inputs, 5)
    first = kern(*feed.values())
    made = []
    at_sizes = kernel_module._at_sizes
    monkeypatch.setattr(kernel_module, "_at_sizes", lambda t, sizes: made.append(t) or at_sizes(t, sizes))
    np.testing.assert_array_equal(kern(*feed.values()), first)
    assert made == []
    other = _feed(inputs, 7)  # new shapes: bound once
    _check([kern(*other.values())], tg.evaluate(outs, other), "n=7")
    assert len(made) == len(inputs) + len(outs)


def test_a_weight_gradient_summed_over_the_batch_reads_a_padded_copy():
    """A padded convolution's weight gradient sums over the batch, a reduce axis of run-time
    extent: that axis is kept whole in the hull and the input is read from a zero-padded copy
    (so the spatial sums run over constant bounds: the digits CNN's weight gradient then runs
    in a vector accumulator, as at fixed sizes), and the values are the oracle's at every
    batch size, the smallest included."""
    n = tg.var("n", min=1)
    X = tg.placeholder((n, 1, 6, 6), name="X")
    W = tg.placeholder((4, 1, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, padding=1)
    H = tg.placeholder(Y.shape, name="H")
    (dW,) = tg.differentiate(Y, [W], head=H)
    stages = stages_for([dW])
    (copy,) = [s.tensor for s in stages if s.tensor.name == "X_padded"]
    assert copy.shape[0] is n and copy.shape[1:] == (1, 8, 8)
    (dw,) = [s for s in stages if s.tensor is dW]
    assert all(str(lp.lo) == "0" and str(lp.hi) in ("n", "6") for lp in loops(dw.body)[-3:])  # no padding guards
    kern = tg.build([dW], [X, H])
    rng = np.random.default_rng(0)
    for rows in (1, 3, 8):
        x = rng.standard_normal((rows, 1, 6, 6)).astype(np.float32)
        h = rng.standard_normal((rows, 4, 6, 6)).astype(np.float32)
        (want,) = tg.evaluate([dW], {X: x, H: h})
        np.testing.assert_allclose(kern(x, h), want, rtol=1e-4, atol=1e-4)


def _tiny_images(stride: int):
    """A padded 3 x 3 convolution of 4 x 4 images with many channels on a batch of run-time
    extent: its forward, input gradient and weight gradient, and the inputs of each."""
    n = tg.var("n", min=1)
    X, W = tg.placeholder((n, 32, 4, 4), name="X"), tg.placeholder((32, 32, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, stride=stride, padding=1)
    H = tg.placeholder(Y.shape, name="H")
    (dX,) = tg.gradient(Y, [X], head=H)
    (dW,) = tg.gradient(Y, [W], head=H)
    return {"fwd": (Y, [X, W]), "dx": (dX, [W, H]), "dw": (dW, [X, H])}


def _accumulating_bounds(stage):
    from codegen.loopir import Nest
    nests = [Nest.of(s) for s in stage.body]
    return [[(lp.lo, lp.hi) for lp in n.loops if isinstance(lp.var, tg.ir.ReduceAxis)]
            for n in nests if n is not None and n.accumulates]


@pytest.mark.parametrize("stride", [1, 2])
def test_tiny_images_on_a_run_time_batch_are_scheduled_as_at_fixed_sizes(stride):
    """ResNet-18's convolutions at CIFAR size with the batch known only at run time: the
    forward's output is cut into pieces with constant reduce bounds (the batch axis whole in
    each), a stride-2 input gradient into congruence classes, and the weight gradient reads
    the input from a copy with the channels last; each runs in register blocks as the
    fixed-size kernel does, and computes the oracle's values at every batch size."""
    from te_grad.ir import Const
    graphs = _tiny_images(stride)
    for what, (out, inputs) in graphs.items():
        stages = stages_for([out])
        # the nests before register blocks and cache tiles make them imperfect
        plain = stages_for([out], options=CompileOptions(disabled_passes=frozenset({"block_registers", "tile_stage"})))
        (stage,) = [s for s in plain if s.tensor is out]
        bounds = _accumulating_bounds(stage)
        if what == "dx" and stride == 2:
            assert len(bounds) > 1, what  # congruence classes, not one nest with alternating bounds
        if what == "fwd":  # pieces (or a zero-padded copy): constant bounds, not max/min of the output axes
            assert any(all(isinstance(e, Const) for b in nest for e in b) for nest in bounds)
        if what == "dw":
            assert any(s.tensor.name.endswith("_packed") and s.tensor.shape[0] is inputs[0].shape[0]
                       for s in stages), "the input copied with its channels last, the batch whole"
        with codegen.compile_options(disk_cache=False):
            kern = tg.build([out], inputs)
        assert "in vector registers" in kern.loops, what
        for size in (1, 3, 9):
            feed = _feed(inputs, size)
            _check([kern(*feed.values())], tg.evaluate([out], feed), f"{what} at n={size}")


def test_a_reduce_loop_of_run_time_extent_is_cut_one_value_at_a_time_for_the_cache():
    """A linear layer's weight gradient on a sequence model, ``dW[o, i] = sum over (b, s) of
    dY[b, s, o] H[b, s, i]`` with the batch ``b`` of run-time extent: ``H`` is re-read for
    every block of ``o``, and over the whole batch it is more than the L2 holds (judged at
    the representative batch), while one value of ``b`` fits. The batch loop is then taken
    one value at a time outside the parallel loop (the sequence loop, constant, inside), so
    each ``H[b]`` stays in the cache for every block of ``o``; the values are the oracle's at
    every batch size, interpreted and native. Not where the batch loop runs inside another
    reduce loop, nor where the output does not fit the cache."""
    from codegen.options import Thresholds
    from codegen.loopir import Loop
    from codegen.machine import Machine
    n = tg.var("n", min=1)
    rows = Thresholds().min_tile_steps  # the fewest sequence steps a value of b must hold
    dY, H = tg.placeholder((n, rows, 8), name="dY"), tg.placeholder((n, rows, 64), name="H")
    b, s = tg.reduce_axis((0, n), "b"), tg.reduce_axis(rows, "s")
    dW = tg.compute((8, 64), lambda o, i: tg.sum(dY[b, s, o] * H[b, s, i], axis=[b, s]), name="dW")
    # one value of b: 16 rows of H (4 KB); the representative batch: 1 MB; half the L2: 32 KB
    machine = Machine(vector_bits=256, vector_registers=16, l1_bytes=32 * 1024, l2_bytes=64 * 1024)
    options = CompileOptions(machine=machine)
    (stage,) = [st for st in stages_for([dW], options=options) if st.tensor is dW]
    (outer,) = [st for st in stage.body if isinstance(st, Loop) and st.var.name == "bt"]
    assert str(outer.hi) == "n" and not outer.parallel
    assert outer.body[0].parallel  # the blocks of o, split among threads, inside the batch loop
    (cut,) = [lp for lp in loops(outer.body) if lp.var is b]
    assert cut.lo is outer.var and str(cut.hi) == "bt + 1"
    assert any(isinstance(lp.kind, RegisterBlocked) for lp in loops(outer.body))
    untiled = stages_for([dW], options=CompileOptions(machine=machine, disabled_passes=frozenset({"tile_stage"})))
    assert not any(lp.var.name == "bt" for st in untiled for lp in loops(st.body))
    with codegen.compile_options(disk_cache=False, machine=machine):
        kern = tg.build([dW], [dY, H])
    assert "for (bt = 0; bt < n; ++bt)" in kern.loops

    def cut(out, opts=options):
        (st,) = [st for st in stages_for([out], options=opts) if st.tensor is out]
        return any(lp.var.name == "bt" for lp in loops(st.body))

    # not where the batch loop runs inside the sequence loop (the sum's order would change) ...
    dYt, Ht = tg.placeholder((rows, n, 8), name="dYt"), tg.placeholder((rows, n, 64), name="Ht")
    inner = tg.compute((8, 64), lambda o, i: tg.sum(dYt[s, b, o] * Ht[s, b, i], axis=[s, b]), name="inner")
    # ... nor where the output, loaded and stored once per value of b, is more than the cache holds
    # (252 rows: whole blocks of 6, no remainder nest, whose own output of a few rows would fit)
    many = tg.placeholder((n, rows, 252), name="many")  # 252 x 64 outputs: 63 KB
    big = tg.compute((252, 64), lambda o, i: tg.sum(many[b, s, o] * H[b, s, i], axis=[b, s]), name="big")
    assert not cut(inner, CompileOptions(machine=machine, thresholds=Thresholds(min_tile_steps=1)))
    assert not cut(big)
    for size in SIZES:
        feed = _feed([dY, H], size)
        want = tg.evaluate([dW], feed)
        _check([run([stage], feed)[id(dW)]], want, f"interpreted at n={size}")
        _check([kern(*feed.values())], want, f"native at n={size}")


def test_lanes_across_rows_of_a_tensor_with_a_run_time_stride():
    """A linear layer written on a (1, n, 8, 5) tensor with the batch second (as
    ``nn.MultiheadAttention``'s projections are): the register block's lanes run along an
    axis of stride 5, not contiguous in the store, in a tensor whose outer strides are known
    only at run time; so do the lanes of its gradients' reads. The block and the gathers are
    built (a stride of the batch times a constant, where the lanes do not move, adds nothing;
    a run-time stride the lanes do move along is a value, not a constant), and every result
    is the oracle's at every batch size."""
    n = tg.var("n", min=1)
    C, W = tg.placeholder((n, 1, 8, 5), name="C"), tg.placeholder((5, 5), name="W")
    k = tg.reduce_axis(5, "k")
    Y = tg.compute((1, n, 8, 5), lambda i0, i1, i2, i3: tg.sum(C[i1, i0, i2, k] * W[i3, k], axis=k), name="Y")
    H = tg.placeholder(Y.shape, name="H")
    outs = [Y] + list(tg.gradient(Y, [C, W], head=H))
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(outs, [C, W, H])
    assert "in vector registers" in kern.loops
    for size in SIZES + (17,):
        feed = _feed([C, W, H], size)
        _check(kern(*feed.values()), tg.evaluate(outs, feed), f"n={size}")
