"""Structural zeros carried across tensors (simplify/zeros.py) and triangles cut into blocks
(codegen/triangles.py): attention written with a full score matrix and a causal or band mask
does the banded form's work, with the values of the raw gradient, of finite differences and of
the evaluator."""
from unittest import mock

import numpy as np
import pytest

import te_grad as tg
from codegen.options import compile_options
from te_grad.graph import topo_order
from te_grad.testing import check_gradients, random_feed
from simplify.zeros import carry_zeros

H, S, D = 2, 40, 8


def _mask(kind, i, j):
    if kind == "causal":
        return j <= i
    return tg.all(j <= i, i - j < 6)


def _full(kind, q, k, v, hand=False):
    d = tg.reduce_axis(D, "d")
    sc = tg.compute((H, S, S), lambda h, i, j: tg.sum(q[h, i, d] * k[h, j, d], axis=d), name="scores")
    m = tg.compute((H, S, S), lambda h, i, j: tg.if_then_else(_mask(kind, i, j), sc[h, i, j], -np.inf),
                   name="masked")
    if hand:  # the max shift written by hand, no stop_gradient
        r = tg.reduce_axis(S, "r")
        mx = tg.compute((H, S), lambda h, i: tg.max(m[h, i, r], axis=r), name="mx")
        e = tg.compute((H, S, S), lambda h, i, j: tg.exp(m[h, i, j] - mx[h, i]), name="e")
        r2 = tg.reduce_axis(S, "r2")
        z = tg.compute((H, S), lambda h, i: tg.sum(e[h, i, r2], axis=r2), name="z")
        p = tg.compute((H, S, S), lambda h, i, j: e[h, i, j] / z[h, i], name="p")
    else:
        p = tg.nn.softmax(m, axis=2)
    c = tg.reduce_axis(S, "c")
    return tg.compute((H, S, D), lambda h, i, f: tg.sum(p[h, i, c] * v[h, c, f], axis=c), name="out")


def _banded(kind, q, k, v):
    width = S if kind == "causal" else 6
    d = tg.reduce_axis(D, "d")
    sc = tg.compute((H, S, width), lambda h, i, w: tg.if_then_else(
        i - w >= 0, tg.sum(q[h, i, d] * k[h, i - w, d], axis=d), -np.inf), name="scores")
    p = tg.nn.softmax(sc, axis=2)
    w = tg.reduce_axis(width, "w")
    return tg.compute((H, S, D), lambda h, i, f: tg.sum(
        tg.if_then_else(i - w >= 0, p[h, i, w] * v[h, i - w, f], 0.0), axis=w), name="out")


def _inputs(dtype="float32"):
    return [tg.placeholder((H, S, D), dtype=dtype, name=n) for n in "QKV"]


def _counts(form, kind, off=False):
    q, k, v = _inputs()
    with mock.patch("simplify.rewrite.carry_zeros", lambda *a, **kw: {}) if off else _nothing():
        o = form(kind, q, k, v)
        grads = tg.gradient(o, [q, k, v], head=tg.placeholder(o.shape, name="dO"))
        return tg.iterations(tg.simplify(o)), tg.iterations(tg.simplify(list(grads)))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_causal_attention_with_a_full_score_matrix_does_the_banded_forms_work():
    full, banded, off = _counts(_full, "causal"), _counts(_banded, "causal"), _counts(_full, "causal", off=True)
    for got, want, before in zip(full, banded, off):
        assert got <= 1.1 * want, (full, banded)
        assert got < 0.65 * before, (full, off)  # without carrying the zeros: every score computed


def test_band_attention_sums_only_the_band():
    full, off = _counts(_full, "band"), _counts(_full, "band", off=True)
    assert full[0] < 0.5 * off[0] and full[1] < 0.5 * off[1], (full, off)


@pytest.mark.parametrize("kind", ["causal", "band"])
@pytest.mark.parametrize("hand", [False, True], ids=["nn_softmax", "hand_shift"])
def test_masked_attention_gradients_are_exact(kind, hand):
    q, k, v = _inputs("float64")
    o = _full(kind, q, k, v, hand=hand)
    rng = np.random.default_rng(1)
    feed = random_feed([q, k, v], rng)
    head = tg.placeholder(o.shape, dtype="float64", name="dO")
    res = tg.differentiate(o, [q, k, v], head=head)
    raw = tg.differentiate(o, [q, k, v], head=head, simplify=False)
    feed[head] = rng.standard_normal(o.shape)
    simplified = tg.evaluate(list(res), feed)
    for a, b in zip(simplified, tg.evaluate(list(raw), feed)):  # the raw VJP: every score computed
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    check_gradients(o, [q, k, v], feed, grads=list(res), head=head, head_value=feed[head], full_limit=0,
                    directions=3)
    with compile_options(poison=True):  # a point of a tensor written only on the mask, read, shows
        kern = tg.build([o] + list(res), [q, k, v, head])
        got = kern(*[feed[t] for t in (q, k, v, head)])
    np.testing.assert_allclose(got[0], tg.evaluate([o], feed)[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(got[1:], simplified):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_a_mask_read_through_a_nonlinear_function_is_not_carried():
    """``exp(if_then_else(mask, a, 0))`` is 1, not 0, where the mask is false: nothing to drop."""
    x = tg.placeholder((S, S), dtype="float64", name="X")
    v = tg.placeholder((S, 3), dtype="float64", name="V")
    z = tg.compute((S, S), lambda i, j: tg.if_then_else(j <= i, x[i, j], 0.0), name="Z")
    e = tg.compute((S, S), lambda i, j: tg.exp(z[i, j]), name="E")
    c = tg.reduce_axis(S, "c")
    o = tg.compute((S, 3), lambda i, f: tg.sum(e[i, c] * v[c, f], axis=c), name="O")
    assert carry_zeros([o]) == {}
    with mock.patch("simplify.rewrite.carry_zeros", lambda *a, **kw: {}):
        before = tg.iterations(tg.simplify(o))
    assert tg.iterations(tg.simplify(o)) == before
    rng = np.random.default_rng(2)
    feed = random_feed([x, v], rng)
    (got,) = tg.simplify([o])
    np.testing.assert_allclose(tg.evaluate([got], feed)[0], tg.evaluate([o], feed)[0], rtol=1e-13)
    check_gradients(o, [x, v], feed, full_limit=0)


def test_outputs_and_kept_tensors_keep_their_values_everywhere():
    """A masked tensor that is itself an output (or kept, as the forward tensors of a
    gradient are) keeps its values everywhere, and a kept tensor whose producers are kept
    stays the same object: only tensors no one outside reads are narrowed."""
    x = tg.placeholder((S, S), dtype="float64", name="X")
    v = tg.placeholder((S, 3), dtype="float64", name="V")
    z = tg.compute((S, S), lambda i, j: tg.if_then_else(j <= i, x[i, j], -np.inf), name="Z")
    p = tg.nn.softmax(z, axis=1)
    c = tg.reduce_axis(S, "c")
    o = tg.compute((S, 3), lambda i, f: tg.sum(p[i, c] * v[c, f], axis=c), name="O")
    feed = random_feed([x, v], np.random.default_rng(3))
    want = dict(zip("zpo", tg.evaluate([z, p, o], feed)))
    carried = carry_zeros([o, p])
    assert id(p) in carried and id(o) in carried  # rebuilt: o sums the triangle only
    got = tg.evaluate([carried[id(p)], carried[id(o)]], feed)
    np.testing.assert_array_equal(got[0], want["p"])
    np.testing.assert_allclose(got[1], want["o"], rtol=1e-13)
    carried = carry_zeros([o], keep={id(z), id(p)})
    assert id(z) not in carried  # kept, and so are its producers
    np.testing.assert_array_equal(tg.evaluate([carried.get(id(p), p)], feed)[0], want["p"])
    carried = carry_zeros([o])  # z is no output: -inf where masked is no longer needed
    np.testing.assert_allclose(tg.evaluate([carried[id(o)]], feed)[0], want["o"], rtol=1e-13)
    plain = tg.compute((S, 3), lambda i, f: tg.sum(x[i, c] * v[c, f], axis=c), name="plain")
    assert carry_zeros([plain]) == {}


def _band_points(kind):
    i, j = np.indices((S, S))
    keep = (j <= i) if kind == "causal" else (j <= i) & (i - j < 6)
    return keep


@pytest.mark.parametrize("kind", ["causal", "band"])
def test_masked_attention_does_the_banded_forms_iterations(kind):
    """The full form's element-wise tensors (the masked scores, the exponentials, the softmax and
    its gradient) are counted, and written, on the mask only (simplify/unread.py): forward and
    backward within 1.1x of the banded form's iterations (without the regions: 1.4x and more for
    the band)."""
    full, banded = _counts(_full, kind), _counts(_banded, kind)
    for got, want in zip(full, banded):
        assert got <= 1.1 * want, (full, banded)


def _band_graph(kind, dtype="float64"):
    q, k, v = _inputs(dtype)
    o = _full(kind, q, k, v)
    head = tg.placeholder(o.shape, dtype=dtype, name="dO")
    res = tg.differentiate(o, [q, k, v], head=head)
    return (q, k, v, head), o, list(res)


@pytest.mark.parametrize("kind", ["causal", "band"])
def test_masked_tensors_are_written_only_on_the_mask(kind):
    """The kernel's stages write the softmax and its exponentials only inside the mask: run by
    the loop interpreter (intermediates start as NaN), exactly the mask's points are written;
    the masked copy of the scores is not made (its readers read the scores); the kernel, its
    intermediates poisoned, agrees with the evaluator."""
    from codegen.interpret import run
    from codegen.schedule import stages_for
    from simplify.unread import read_through, written_regions
    inputs, o, res = _band_graph(kind)
    outs = tg.simplify([o] + res)
    regions = written_regions(outs)
    named = {t.name: t for t in topo_order(outs) if id(t) in regions}
    assert {"softmax", "softmax_exp"} <= set(named), sorted(named)
    through = read_through(outs, regions)  # the masked copy of the already masked scores
    assert [(t.name, through[id(t)].name) for t in topo_order(outs) if id(t) in through] == [("masked", "scores")]
    stages = stages_for(outs)
    assert "masked" not in {s.tensor.name for s in stages}
    rng = np.random.default_rng(3)
    feed = random_feed(list(inputs), rng)
    values = run(stages, feed)
    keep = np.broadcast_to(_band_points(kind), (H, S, S))
    for name in ("softmax", "softmax_exp"):
        written = ~np.isnan(values[id(named[name])])
        assert np.array_equal(written, keep), name
    want = tg.evaluate([o] + res, feed)
    with compile_options(poison=True, disk_cache=False):
        got = tg.build([o] + res, list(inputs))(*[feed[t] for t in inputs])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_poisoned_intermediates_show_a_read_outside_the_region():
    """The witness can fail: with a region one diagonal too narrow for the softmax, the stages
    that read it there get NaN from the poisoned buffer, and the outputs show it."""
    import codegen.schedule as schedule
    from simplify.unread import written_regions
    inputs, o, res = _band_graph("band")
    rng = np.random.default_rng(4)
    feed = random_feed(list(inputs), rng)

    def narrower(outputs, keep=()):
        got = written_regions(outputs, keep)
        for t in topo_order(list(outputs)):
            if t.name == "softmax" and id(t) in got:
                j, l = t.op.axes[1], t.op.axes[2]
                got[id(t)] = tg.all(l <= j, j - l < 5)
        return got
    with mock.patch.object(schedule, "written_regions", narrower), compile_options(poison=True, disk_cache=False,
                                                                                   jit_cache=0):
        got = tg.build([o] + res, list(inputs))(*[feed[t] for t in inputs])
    assert any(np.isnan(a).any() for a in got)


def test_a_tensor_read_outside_its_mask_is_written_everywhere():
    """``P = if_then_else(j <= i, X, 0)`` read everywhere (``2 P + 1`` is not zero where the mask
    is), or in an index under the mask (a value outside would be an address), keeps every point."""
    from simplify.unread import written_regions
    x = tg.placeholder((S, S), dtype="float64", name="X")
    w = tg.placeholder((S,), dtype="float64", name="W")
    p = tg.compute((S, S), lambda i, j: tg.if_then_else(j <= i, x[i, j], 0.0), name="P")
    o = tg.compute((S, S), lambda i, j: p[i, j] * 2.0 + 1.0, name="O")
    assert written_regions([o]) == {}
    guarded = tg.compute((S, S), lambda i, j: tg.if_then_else(j <= i, p[i, j] * 2.0, 0.0), name="G")
    assert [t.name for t in topo_order([guarded]) if id(t) in written_regions([guarded])] == ["P"]
    indexed = tg.compute((S, S), lambda i, j: tg.if_then_else(
        j <= i, w[tg.cast("int64", p[i, j]) % S], 0.0), name="I")
    assert written_regions([indexed]) == {}
    rng = np.random.default_rng(5)
    feed = random_feed([x], rng)
    with compile_options(poison=True, disk_cache=False):
        got = tg.build([o], [x])(feed[x])
    np.testing.assert_allclose(got, tg.evaluate([o], feed)[0], rtol=1e-13)


def test_a_padded_convolution_hull_never_reads_a_tensor_written_on_its_region():
    """A per-position filter ``K[h, r]``, masked where its tap leaves the sequence (a relation
    of ``h`` and ``r``), is written only there; the convolution reading it must then not be
    summed over a zero-padded hull (codegen/packing.py), whose added points would read ``K``
    where it was never written (0 times NaN is NaN). Interpreted and compiled with poisoned
    intermediates, the output is the evaluator's."""
    from codegen.interpret import run
    from codegen.schedule import stages_for
    from simplify.unread import written_regions
    b_n, c_n, n, taps = 8, 4, 128, 5
    x = tg.placeholder((b_n, c_n, n), dtype="float64", name="X")
    w = tg.placeholder((c_n, c_n), dtype="float64", name="W")
    a = tg.placeholder((n, 8), dtype="float64", name="A")
    bw = tg.placeholder((8, taps), dtype="float64", name="B")
    k = tg.reduce_axis(8, "k")
    filt = tg.compute((n, taps), lambda h, r: tg.if_then_else(tg.all(h + r >= 2, h + r < n + 2),
                                                              tg.sum(a[h, k] * bw[k, r], axis=k), 0.0), name="K")
    r, c = tg.reduce_axis(taps, "r"), tg.reduce_axis(c_n, "c")
    y = tg.compute((b_n, c_n, n), lambda b, o, h: tg.sum(
        tg.if_then_else(tg.all(h + r - 2 >= 0, h + r - 2 < n), x[b, c, h + r - 2], 0.0) * filt[h, r] * w[o, c],
        axis=[c, r]), name="Y")
    inputs = [x, w, a, bw]
    feed = random_feed(inputs, np.random.default_rng(6))
    want = tg.evaluate([y], feed)[0]
    simple = tg.simplify([y])
    assert [t.name for t in topo_order(simple) if id(t) in written_regions(simple)] == ["K"]
    np.testing.assert_allclose(run(stages_for(simple), feed)[id(simple[0])], want, rtol=1e-12, atol=1e-12)
    with compile_options(poison=True, disk_cache=False):
        got = tg.build([y], inputs)(*[feed[t] for t in inputs])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_shared_subexpression_is_walked_once():
    """A reader whose body shares a subexpression level after level (``e = tanh(e * e + e)``,
    a DAG of 2^12 paths) is walked once per node: a handful of isl implications, not one per path."""
    import simplify.unread as unread
    a = tg.placeholder((S, 4), dtype="float64", name="A")
    d = tg.reduce_axis(4, "d")
    t = tg.compute((S, S), lambda i, j: tg.if_then_else(j <= i, tg.sum(a[i, d] * a[j, d], axis=d), 0.0), name="T")

    def body(i, j):
        e = t[i, j]
        for _ in range(12):
            e = tg.tanh(e * e + e)
        return tg.if_then_else(j <= i, e, 0.0)
    u = tg.compute((S, S), body, name="U")
    calls, implies = [], unread.implies

    def counted(*args):
        calls.append(args)
        return implies(*args)
    with mock.patch.object(unread, "implies", counted):
        regions = unread.written_regions([u])
    assert [x.name for x in topo_order([u]) if id(x) in regions] == ["T"]
    assert len(calls) <= 2, len(calls)


@pytest.mark.parametrize("factor", ["copy_of_placeholder", "lifted_max"])
def test_a_padded_hull_never_reads_what_the_graph_never_evaluates(factor):
    """Two more factors a zero-padded hull must not read at its added points: the placeholder a
    masked copy's readers read instead of the copy (``F`` is inf outside the mask, where the copy
    was 0), and a reduction lifted out of the term (computed at every point, from a tensor
    written only on its mask). The output is the evaluator's, compiled and interpreted."""
    from codegen.interpret import run
    from codegen.schedule import stages_for
    b_n, c_n, n, taps, kk = 8, 4, 128, 5, 3
    x = tg.placeholder((b_n, c_n, n), dtype="float64", name="X")
    w = tg.placeholder((c_n, c_n), dtype="float64", name="W")
    inside = lambda h, r: tg.all(h + r >= 2, h + r < n + 2)  # noqa: E731
    r, c = tg.reduce_axis(taps, "r"), tg.reduce_axis(c_n, "c")
    rng = np.random.default_rng(7)
    feed = {x: rng.standard_normal(x.shape), w: rng.standard_normal(w.shape)}
    if factor == "copy_of_placeholder":
        f = tg.placeholder((n, taps), dtype="float64", name="F")
        filt = tg.compute((n, taps), lambda h, r_: tg.if_then_else(inside(h, r_), f[h, r_], 0.0), name="K")
        value = np.where(np.add.outer(np.arange(n), np.arange(taps)) < 2, np.inf, rng.standard_normal((n, taps)))
        feed[f] = value
        tap = lambda h: filt[h, r]  # noqa: E731
        extra = [f]
    else:
        a = tg.placeholder((n, kk), dtype="float64", name="A")
        bw = tg.placeholder((kk, taps), dtype="float64", name="B")
        t = tg.compute((n, taps, kk), lambda h, r_, k: tg.if_then_else(
            inside(h, r_), tg.exp(a[h, k] * bw[k, r_]), 0.0), name="T")
        feed.update({a: rng.standard_normal(a.shape), bw: rng.standard_normal(bw.shape)})
        k = tg.reduce_axis(kk, "k")
        tap = lambda h: tg.max(t[h, r, k], axis=k)  # noqa: E731
        extra = [a, bw]
    y = tg.compute((b_n, c_n, n), lambda b, o, h: tg.sum(
        tg.if_then_else(tg.all(h + r - 2 >= 0, h + r - 2 < n), x[b, c, h + r - 2], 0.0) * tap(h) * w[o, c],
        axis=[c, r]), name="Y")
    inputs = [x, w] + extra
    want = tg.evaluate([y], feed)[0]
    assert np.all(np.isfinite(want))
    simple = tg.simplify([y])
    np.testing.assert_allclose(run(stages_for(simple), feed)[id(simple[0])], want, rtol=1e-12, atol=1e-12)
    with compile_options(poison=True, disk_cache=False):
        got = tg.build([y], inputs)(*[feed[t_] for t_ in inputs])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
