"""te_grad.tools.plot: the points drawn are the exact domains (checked against isl) and the ratios."""
import json
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install te_grad[test])")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import islpy as isl  # noqa: E402

import te_grad as tg  # noqa: E402
from te_grad.tools.plot import plot_domain, plot_ratios, plot_raw_vs_simplified  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _conv(stride=2, padding=1, dilation=1, size=9):
    X = tg.placeholder((1, 2, size, size), name="X")
    W = tg.placeholder((3, 2, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, stride=stride, padding=padding, dilation=dilation)
    dY = tg.placeholder(Y.shape, name="dY")
    return X, W, Y, tg.differentiate(Y, [X, W], head=dY)


def _isl_count(tensor, at) -> int:
    """Points of the tensor's (single) iteration domain with the output indices fixed to ``at``."""
    (dom,) = tg.domain(tensor)
    s = isl.Set(dom.isl)
    for d, v in enumerate(at):
        s = s.fix_val(isl.dim_type.set, d, v)
    return s.count_val().to_python()


def _offsets(pic) -> int:
    return sum(len(a.get_offsets()) for a in pic.artists)


@pytest.mark.parametrize("at", [(0, 1, 3, 3), (0, 1, 4, 4), (0, 0, 0, 0), (0, 1, 8, 5)])
def test_simplified_points_are_the_isl_domain(at):
    _, _, _, res = _conv()
    pic = plot_domain(res[0], at, dims=("h", "w"))
    assert pic.n_iterated == _isl_count(res[0], at) > 0
    assert pic.n_contributing == pic.n_iterated  # no zero is summed
    assert int(pic.cell_points.sum()) == pic.n_iterated
    assert _offsets(pic) == pic.n_drawn == len(pic.cells)
    assert len(pic.artists[0].get_offsets()) == 0  # nothing grey


def test_domain_not_projected_when_two_loops():
    """dW's simplified loops are (h, w): one marker per point, as many as isl counts."""
    _, _, _, res = _conv()
    for at in [(1, 1, 0, 0), (2, 0, 1, 2), (0, 1, 2, 2)]:
        pic = plot_domain(res[1], at)
        assert set(pic.dims) == {"h", "w"}
        assert pic.n_drawn == pic.n_iterated == _isl_count(res[1], at)
        assert np.all(pic.cell_points == 1)


def test_raw_contributing_points_are_the_simplified_domain():
    """Over every element, the raw VJP's contributing points are exactly the simplified points."""
    _, _, _, res = _conv(size=7)
    for g, raw in zip(res.gradients, res.raw):
        fig, ax = plt.subplots()
        contributing = iterated = simplified = 0
        for at in np.ndindex(*g.shape):
            p = plot_domain(raw, at, ax=ax)
            contributing += p.n_contributing
            iterated += p.n_iterated
            ax.clear()
            simplified += plot_domain(g, at, ax=ax).n_iterated
            ax.clear()
        assert iterated == tg.iterations(raw)
        assert contributing == simplified == tg.iterations(g)


def test_raw_vs_simplified_side_by_side():
    _, _, _, res = _conv()
    left, right = plot_raw_vs_simplified(res, 0, at=(0, 1, 3, 3), dims=("h", "w"))
    assert left.ax.figure is right.ax.figure
    assert left.n_iterated == tg.iterations(res.raw[0]) // res[0].size
    assert left.n_contributing == right.n_iterated == 12
    assert _offsets(left) == 25 and len(left.artists[1].get_offsets()) == 4
    assert _offsets(right) == 4
    assert left.ax.get_xlim() == right.ax.get_xlim() and left.ax.get_ylim() == right.ax.get_ylim()
    assert "raw VJP" in left.ax.get_title() and "12 contribute" in right.ax.get_title()


def test_raw_vs_simplified_defaults_and_dense():
    """Default element and dims; a raw loop solved away is labelled as such."""
    A, B = tg.placeholder((4, 6), name="A"), tg.placeholder((3, 6), name="B")
    res = tg.differentiate(tg.nn.dense(A, B), [A, B])
    left, right = plot_raw_vs_simplified(res)
    assert left.at == right.at == (2, 3)
    assert right.dims == ("j",) and left.dims[0] == "j"
    assert left.n_contributing == right.n_iterated == 3
    assert "solved by isl" in right.ax.get_ylabel()
    left, right = plot_raw_vs_simplified(res, 0, dims=("j", "k"))  # k is solved away
    assert left.dims == ("j", "k") and right.dims == ("j",)


def test_padding_guard_is_a_zero_factor():
    """dW at the top-left tap: row or column 0 of the output reads the padding and contributes 0."""
    _, _, _, res = _conv()
    raw = plot_domain(res.raw[1], (1, 1, 0, 0), dims=("h", "w"))
    grey = {tuple(p) for p in raw.artists[0].get_offsets().data.astype(int)}
    assert grey == {(0, k) for k in range(5)} | {(k, 0) for k in range(5)}
    assert raw.n_contributing == 16


def test_empty_domain_and_elementwise():
    X = tg.placeholder((1, 1, 12, 12), name="X")
    W = tg.placeholder((1, 1, 3, 3), name="W")
    res = tg.differentiate(tg.nn.conv2d(X, W, stride=2, dilation=2), [X, W])
    odd = plot_domain(res[0], (0, 0, 5, 6))
    assert odd.n_iterated == 0 and odd.n_drawn == 0
    assert "empty domain" in " ".join(t.get_text() for t in odd.ax.texts)
    T = tg.placeholder((3, 4), name="T")
    pic = plot_domain(tg.nn.relu(T), (1, 2))
    assert pic.n_iterated == 1 and pic.dims == ()


def test_data_dependent_filter_gives_candidates():
    table = tg.placeholder((5, 3), name="table")
    ids = tg.placeholder((4,), dtype="int64", name="ids")
    res = tg.differentiate(tg.nn.embedding(table, ids), [table])
    raw = plot_domain(res.raw[0], (2, 1))
    assert not raw.filter_evaluated
    assert raw.n_iterated == 12 and raw.n_contributing == 4  # j == 1 is known; ids[i] == 2 is not
    assert "reads ids" in raw.ax.get_title() and "candidates" in raw.ax.get_title()
    scatter = plot_domain(res[0], (2, 1))
    assert scatter.n_iterated == 12 and "for all of dtable" in scatter.ax.get_title()
    assert not scatter.filter_evaluated


def test_nested_bounds_depend_on_outer_loops():
    """A triangular loop: bounds that are expressions of the output index and earlier axes."""
    X = tg.placeholder((6, 6), name="X")
    k = tg.reduce_axis(6, name="k")
    Y = tg.compute((6, 6), lambda i, j: tg.sum(X[i, k], axis=k, where=k <= j), name="cumsum")
    (dX,) = tg.differentiate(Y, [X])
    fig, ax = plt.subplots()
    for j in range(6):  # dX[i, j] sums the heads of outputs j..5
        assert plot_domain(dX, (0, j), ax=ax).n_iterated == 6 - j
    total = sum(plot_domain(dX, at, ax=ax).n_iterated for at in np.ndindex(6, 6))
    assert total == tg.iterations(dX)
    fwd = plot_domain(Y, (0, 2))
    assert fwd.n_iterated == 6 and fwd.n_contributing == 3


def test_errors_are_user_errors():
    _, _, Y, res = _conv()
    with pytest.raises(tg.UserError, match="not a loop variable"):
        plot_domain(res[0], (0, 0, 0, 0), dims=("q", "w"))
    with pytest.raises(tg.UserError, match="not an element"):
        plot_domain(res[0], (0, 5, 0, 0))
    with pytest.raises(tg.UserError, match="placeholder"):
        plot_domain(tg.placeholder((2,), name="P"), (0,))
    with pytest.raises(tg.UserError, match="more than"):
        plot_domain(res.raw[0], (0, 0, 0, 0), limit=100)
    with pytest.raises(tg.UserError, match="tg.differentiate"):
        plot_raw_vs_simplified(Y)
    with pytest.raises(tg.UserError, match="out of range"):
        plot_raw_vs_simplified(res, input_index=2)


def test_missing_matplotlib_is_a_clear_error(monkeypatch):
    _, _, _, res = _conv()
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(tg.UserError, match=r"pip install te_grad\[notebooks\]"):
        plot_domain(res[0], (0, 0, 0, 0))


def _bar_heights(pic):
    return sorted(round(p.get_height(), 6) for p in pic.ax.patches)


def test_ratios_from_bench_json(tmp_path):
    bench = {"meta": {}, "summary": {}, "ops": [
        {"op": "dense", "te_grad": {"fwd_ms": 2.0, "bwd_ms": 6.0}, "torch": {"fwd_ms": 1.0, "bwd_ms": 4.0},
         "jax": {"fwd_ms": 4.0, "bwd_ms": 3.0}},
        {"op": "softmax", "te_grad": {"fwd_ms": 1.0, "bwd_ms": 1.0}, "torch": {"fwd_ms": 2.0, "bwd_ms": 5.0}},
        {"op": "broken", "te_grad": {"error": "boom"}, "torch": {"fwd_ms": 1.0}},
    ]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bench))
    pic = plot_ratios(str(path))
    assert pic.ratios == {"dense": {"fwd": 2.0, "bwd": 1.5}, "softmax": {"fwd": 0.5, "bwd": 0.2}}
    assert _bar_heights(pic) == [0.2, 0.5, 1.5, 2.0]
    assert pic.ax.get_yscale() == "log"
    assert any(list(line.get_ydata()) == [1.0, 1.0] for line in pic.ax.get_lines())
    assert [t.get_text() for t in pic.ax.get_xticklabels()] == ["dense", "softmax"]
    jax = plot_ratios(bench, against="jax")
    assert jax.ratios == {"dense": {"fwd": 0.5, "bwd": 2.0}} and "JAX" in jax.ax.get_ylabel()


def test_ratios_from_plain_tables():
    pic = plot_ratios({"dense": 0.8, "conv2d": 1.25})
    assert pic.ratios == {"dense": {"ratio": 0.8}, "conv2d": {"ratio": 1.25}}
    assert _bar_heights(pic) == [0.8, 1.25]
    rows = plot_ratios([{"op": "a", "fwd": 0.5, "bwd": 3}, {"op": "b", "fwd": 2.0}])
    assert rows.ratios == {"a": {"fwd": 0.5, "bwd": 3.0}, "b": {"fwd": 2.0}}
    assert len(rows.ax.patches) == 4  # a missing value is an empty bar


@pytest.mark.parametrize("bad, match", [
    (42, "plot_ratios takes"),
    ({}, "no te_grad"),
    ({"dense": -1.0}, "positive"),
    ({"dense": "fast"}, "must be a number"),
    ([{"ratio": 1.0}], "'op' key"),
    ("/nonexistent/results.json", "cannot read"),
])
def test_ratio_errors(bad, match):
    with pytest.raises(tg.UserError, match=match):
        plot_ratios(bad)


@pytest.mark.parametrize("fn, name", [(tg.erf, "erf"), (tg.atan, "atan"), (tg.log1p, "log1p"),
                                      (tg.expm1, "expm1"), (tg.asin, "asin"), (tg.acos, "acos")])
def test_filters_with_any_intrinsic_are_evaluated(fn, name):
    """A filter computed with an intrinsic (here erf, atan, ... of the index) is evaluated by the
    reference evaluator's own meaning of it: the contributing points are those where it holds,
    counted independently with the intrinsic's numpy function."""
    X = tg.placeholder((8, 12), name="X")
    k = tg.reduce_axis(12, "k")
    u = (tg.cast("float64", k) - 5.5) / 6.0  # in (-1, 1): inside asin's and acos's domain
    Y = tg.compute((8,), lambda i: tg.sum(X[i, k], axis=k, where=fn(u) > fn((tg.cast("float64", i) - 3.5) / 6.0)),
                   name="Y")
    numpy_fn = tg.ops.intrinsic(name).numpy
    for i in range(8):
        pic = plot_domain(Y, (i,))
        want = int(np.sum(numpy_fn((np.arange(12) - 5.5) / 6.0) > numpy_fn((i - 3.5) / 6.0)))
        assert 0 < want < 12  # the filter cuts the domain
        assert (pic.n_iterated, pic.n_contributing) == (12, want)


def test_filter_with_atan2_is_evaluated():
    X = tg.placeholder((6, 6), name="X")
    k = tg.reduce_axis(6, "k")
    Y = tg.compute((6,), lambda i: tg.sum(X[i, k], axis=k, where=tg.atan2(tg.cast("float64", k) - 2.5,
                                                                          tg.cast("float64", i) - 2.5) > 0),
                   name="Y")
    for i in range(6):
        pic = plot_domain(Y, (i,))
        want = int(np.sum(np.arctan2(np.arange(6) - 2.5, i - 2.5) > 0))
        assert (pic.n_iterated, pic.n_contributing) == (6, want)
