"""Schedules checked without LLVM: the loop interpreter (codegen.interpret) runs the stages
the scheduler produces, for several machines and with every operand copy forced, and must
give the reference evaluator's values. A schedule that passes here and a kernel that fails
elsewhere point at the lowering; the other way round, at the schedule."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn
from codegen import packing
from codegen.interpret import run
from codegen.loopir import Carried, RegisterBlocked, Transposed, loops_of_kind, plain
from codegen.machine import Machine
from codegen.schedule import stages_for
from te_grad.formulations import resize_exact
from simplify import simplify
from te_grad.graph import topo_order

AVX512 = Machine(vector_bits=512, vector_registers=32, l1_bytes=48 * 1024, l2_bytes=2 << 20)
#: caches so small that every contraction is tiled
TINY = Machine(vector_bits=256, vector_registers=16, l1_bytes=1024, l2_bytes=2048)
NEON = Machine(vector_bits=128, vector_registers=32)


def _with_gradient(y, inputs, seed):
    rng = np.random.default_rng(seed)
    head = tg.placeholder(y.shape, dtype=y.dtype, name="head")
    outs = [y] + list(tg.gradient(y, inputs, head=head))
    feed = {t: rng.standard_normal(t.shape).astype(t.dtype) for t in inputs + [head]}
    return outs, feed


def _ph(shape, name):
    return tg.placeholder(shape, dtype="float64", name=name)


def _graphs():
    for stride, padding, dilation, groups in ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (2, 0, 1, 1), (1, 1, 1, 3)):
        x, w = _ph((2, 3, 7, 7), "X"), _ph((3, 3 // groups, 3, 3), "W")
        y = nn.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
        yield f"conv_s{stride}p{padding}d{dilation}g{groups}", _with_gradient(y, [x, w], 1)
    x, w = _ph((12, 20), "X"), _ph((18, 20), "W")
    yield "dense", _with_gradient(nn.dense(x, w), [x, w], 2)
    a, b = _ph((2, 6, 9), "A"), _ph((2, 5, 9), "B")
    yield "bmm_transposed", _with_gradient(nn.batch_matmul(a, b, transpose_b=True), [a, b], 3)
    x = _ph((2, 2, 8, 8), "X")
    yield "max_pool", _with_gradient(nn.max_pool2d(x, 2), [x], 4)
    yield "max_pool_3_2", _with_gradient(nn.max_pool2d(x, 3, 2), [x], 5)
    yield "avg_pool", _with_gradient(nn.avg_pool2d(x, 2), [x], 6)
    x, g, b = _ph((6, 10), "X"), _ph((10,), "g"), _ph((10,), "b")
    yield "softmax", _with_gradient(nn.softmax(x), [x], 7)
    yield "layer_norm", _with_gradient(nn.layer_norm(x, g, b), [x, g, b], 8)
    k = tg.reduce_axis((0, 10), "k")
    cumsum = tg.compute((6, 10), lambda i, j: tg.sum(x[i, k], axis=k, where=k <= j), name="cumsum")
    yield "cumsum", _with_gradient(cumsum, [x], 9)
    x = tg.placeholder((64, 72), name="X")  # float32: 8 x 8 blocks transpose 32-bit values (exactly)
    yield "transpose", _with_gradient(tg.compute((72, 64), lambda i, j: x[j, i] * 2.0, name="T"), [x], 10)
    x = _ph((1, 2, 6, 6), "X")
    yield "resize_int", _with_gradient(resize_exact(x, 11, 11), [x], 12)
    for kind, mask in (("causal", lambda i, j: j <= i), ("band", lambda i, j: tg.all(j <= i, i - j < 5))):
        # a masked score matrix: its zeros carried across tensors, its triangle cut into blocks
        q, kk, v = _ph((40, 4), "Q"), _ph((40, 4), "K"), _ph((40, 4), "V")
        d, e = tg.reduce_axis(4, "d"), tg.reduce_axis(40, "e")
        sc = tg.compute((40, 40), lambda i, j: tg.if_then_else(
            mask(i, j), tg.sum(q[i, d] * kk[j, d], axis=d), -np.inf), name="scores")
        p = nn.softmax(sc)
        out = tg.compute((40, 4), lambda i, f: tg.sum(p[i, e] * v[e, f], axis=e), name="out")
        yield f"{kind}_attention", _with_gradient(out, [q, kk, v], 13)
    # q, k and v read in blocks of one projection (attention's heads): the gradient is a select
    # on ranges of the last axis, dividing it by 8; a concat that also picks one column alone
    x, h = _ph((6, 3, 48), "X"), _ph((3, 2, 6, 8), "H")
    blocks = [tg.compute((3, 2, 6, 8), lambda b, hh, t, d, o=o: x[t, b, o * 16 + hh * 8 + d], name=f"blk{o}")
              for o in range(3)]
    y = tg.compute(blocks[0].shape, lambda *i: blocks[0][i] * blocks[1][i] + blocks[2][i] * h[i], name="Y")
    yield "chunks", _with_gradient(y, [x, h], 14)
    a, b = _ph((5, 7), "A"), _ph((5, 4), "B")
    cat = nn.concat([a, b], axis=1)
    yield "concat", _with_gradient(tg.compute((5, 11), lambda i, j: tg.if_then_else(
        j == 3, cat[i, j] * 2.0, cat[i, j]), name="C"), [a, b], 15)
    table = _ph((9, 4), "table")
    ids = tg.placeholder((5,), dtype="int32", name="ids")
    emb = tg.compute((5, 4), lambda i, j: table[ids[i], j], name="emb")
    outs, feed = _with_gradient(emb, [table], 11)
    feed[ids] = np.array([3, 0, 3, 8, 1], dtype="int32")
    yield "embedding", (outs, feed)


GRAPHS = dict(_graphs())


@pytest.mark.parametrize("copies", [False, True], ids=["plain", "every_copy"])
@pytest.mark.parametrize("machine", [AVX512, TINY, NEON], ids=["avx512", "tiny_caches", "neon"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_scheduled_stages_interpret_to_the_evaluator(name, machine, copies):
    outs, feed = GRAPHS[name]
    want = tg.evaluate(outs, feed)
    simplified = simplify(outs)
    if copies:
        with packing.using(packing.EVERY_COPY):
            stages = stages_for(simplified, machine)
    else:
        stages = stages_for(simplified, machine)
    got = run(stages, feed)
    for t, w in zip(simplified, want):
        np.testing.assert_allclose(got[id(t)], w, rtol=1e-12, atol=1e-12, err_msg=f"{name}: {t.name}")


def test_the_interpreter_catches_a_wrong_schedule():
    """A witness that can fail: a stage whose loop misses the last row leaves NaN there."""
    outs, feed = GRAPHS["softmax"]
    simplified = simplify(outs)
    stages = stages_for(simplified, AVX512)
    from dataclasses import replace
    from codegen.loopir import Loop
    first = stages[0]
    top = first.body[0]
    assert isinstance(top, Loop)
    short = replace(first, body=(replace(top, hi=top.hi - 1),) + first.body[1:])
    got = run([short] + stages[1:], feed)
    assert np.isnan(got[id(first.tensor)]).any()


def test_schedules_make_the_decisions_expected_for_each_shape():
    """The decisions, read from the loop IR's kinds (not from printed text)."""
    def kinds(name, machine=AVX512):
        outs, _ = GRAPHS[name]
        stages = stages_for(simplify(outs), machine)
        return {k.__name__: sum(len(loops_of_kind(s.body, k)) for s in stages)
                for k in (RegisterBlocked, Transposed, Carried)}
    assert kinds("conv_s1p1d1g1")["RegisterBlocked"] >= 3  # the forward and both gradients
    assert kinds("transpose")["Transposed"] >= 2  # the forward and its gradient, 8 x 8 in registers
    assert kinds("cumsum")["Carried"] == 2  # the prefix sum and its suffix-sum gradient
    assert kinds("softmax")["Transposed"] == 0


@pytest.mark.parametrize("name", ["causal_attention", "band_attention"])
def test_a_triangle_is_cut_into_blocks_of_constant_bounds(name):
    """split_triangles turns each accumulating nest whose loop range follows another loop
    (a triangle ``e < i + 1``, a band guard ``j <= i``) into blocks: in each, the part where
    the relation holds for every row is a box of constant bounds without a guard (the rest
    keeps it), and the blocks visit fewer points than the box around the triangle."""
    from codegen.loopir import Nest
    from codegen.schedule import schedule_steps
    from te_grad.ir import ComputeOp, Const
    outs, _ = GRAPHS[name]

    def nests(stage):
        return [n for n in map(Nest.of, stage.body) if n is not None and n.accumulates]

    def span(b, at):  # a bound's constant, or the constant of maximum / minimum(constant, e)
        return b.value if isinstance(b, Const) else span(b.a if isinstance(b.a, Const) else b.b, at)

    def points(ns):
        return sum(int(np.prod([span(lp.hi, 1) - span(lp.lo, 0) for lp in n.loops])) for n in ns)

    cut = 0
    for t in simplify(outs):
        if not isinstance(t.op, ComputeOp) or t.name not in ("out", "dQ", "scores", "dscores"):
            continue
        before = None
        for step, stage in schedule_steps(t, t.op.body, AVX512):
            if step == "split_triangles":
                after = nests(stage)
                if len(after) > len(before):
                    cut += 1
                    boxes = [n for n in after if n.cond is None and all(
                        isinstance(b, Const) for lp in n.loops for b in (lp.lo, lp.hi))]
                    assert boxes
                    whole = int(np.prod(t.shape)) * max(t.shape)  # every row over every column
                    assert points(after) < 0.7 * whole, (points(after), whole)
                break
            before = nests(stage)
    assert cut >= 2, cut


@pytest.mark.parametrize("name", ["causal_attention", "band_attention"])
def test_a_masked_tensor_is_written_over_its_rows_ranges(name):
    """A tensor written only on its mask (simplify/unread.py): its initialization nest runs
    under the mask, and split_triangles makes that one nest whose inner range follows the row
    (``max(0, i - 4) <= j < i + 1``), no guard left; interpreted, it writes exactly the mask's
    points, the evaluator's values there."""
    from codegen.loopir import Nest
    from codegen.schedule import schedule_steps
    from simplify.unread import written_regions
    from te_grad.graph import topo_order
    from te_grad.ir import Const
    outs, feed = GRAPHS[name]
    simplified = simplify(outs)
    regions = written_regions(simplified)
    (t,) = [t for t in topo_order(simplified) if t.name == "softmax"]
    assert id(t) in regions
    steps = dict(schedule_steps(t, t.op.body, AVX512, region=regions[id(t)]))
    assert Nest.of(steps["definition"].body[0]).cond is not None
    (nest,) = [Nest.of(s) for s in steps["split_triangles"].body]
    assert nest.cond is None and not isinstance(nest.loops[-1].hi, Const)
    values = tg.evaluate([t], feed)[0]
    got = run(stages_for(simplified, AVX512), feed)[id(t)]
    i, j = np.indices(t.shape)
    keep = (j <= i) if name == "causal_attention" else (j <= i) & (i - j < 5)
    assert np.array_equal(~np.isnan(got), keep)
    np.testing.assert_allclose(got[keep], values[keep], rtol=1e-12)


@pytest.mark.parametrize("relation", ["j <= i - 5", "j >= i + 5", "i + j < 40"])
def test_a_written_region_with_empty_rows_is_one_nest(relation):
    """Rows where the relation holds nowhere get an empty range of the same lines (``j <
    i - 4`` is empty for ``i < 5``), so the nest stays one nest without a guard; interpreted,
    it writes exactly the region."""
    from codegen.loopir import Nest
    from codegen.schedule import schedule_steps
    n = 64
    x = _ph((n, n), "X")
    rel = {"j <= i - 5": lambda i, j: j <= i - 5, "j >= i + 5": lambda i, j: j >= i + 5,
           "i + j < 40": lambda i, j: i + j < 40}[relation]
    t = tg.compute((n, n), lambda i, j: tg.if_then_else(rel(i, j), tg.exp(x[i, j]), 0.0), name="T")
    stage = dict(schedule_steps(t, t.op.body, AVX512, region=rel(*t.op.axes)))["split_triangles"]
    (nest,) = [Nest.of(s) for s in stage.body]
    assert nest.cond is None
    feed = {x: np.random.default_rng(18).standard_normal((n, n))}
    got = run([stage], feed)[id(t)]
    i, j = np.indices((n, n))
    keep = np.asarray(rel(i, j))
    assert np.array_equal(~np.isnan(got), keep)
    np.testing.assert_allclose(got[keep], np.exp(feed[x])[keep], rtol=1e-13)


def test_a_narrow_band_is_cut_into_blocks_about_as_tall_as_it_is_wide():
    """A band of 16 over 256 rows: blocks of 16 rows (not 256 / 8 = 32), each one guarded nest
    (a part without the guard narrower than 8 columns joins it): the blocks visit under twice
    the band's points (blocks of 32 visit about three times)."""
    from codegen.loopir import Nest
    from codegen.schedule import schedule_steps
    from te_grad.ir import Const
    n, w = 256, 16
    q, kk = _ph((n, 4), "Q"), _ph((n, 4), "K")
    d = tg.reduce_axis(4, "d")
    sc = tg.compute((n, n), lambda i, j: tg.if_then_else(
        tg.all(j <= i, i - j < w), tg.sum(q[i, d] * kk[j, d], axis=d), 0.0), name="scores")
    stage = dict(schedule_steps(sc, sc.op.body, AVX512))["split_triangles"]
    nests = [x for x in map(Nest.of, stage.body) if x is not None and x.accumulates]
    assert all(isinstance(b, Const) for x in nests for lp in x.loops for b in (lp.lo, lp.hi))
    rows = sorted({(int(x.loops[0].lo.value), int(x.loops[0].hi.value)) for x in nests})
    assert rows == [(a, a + 16) for a in range(0, n, 16)], rows
    assert len(nests) == len(rows)
    visited = sum((int(x.loops[0].hi.value) - int(x.loops[0].lo.value)) *
                  (int(x.loops[1].hi.value) - int(x.loops[1].lo.value)) for x in nests)
    band = sum(min(i + 1, w) for i in range(n))
    assert visited < 2 * band, (visited, band)
    rng = np.random.default_rng(16)
    feed = {t: rng.standard_normal(t.shape) for t in (q, kk)}
    got = run([stage], feed)[id(sc)]
    i, j = np.indices((n, n))
    keep = (j <= i) & (i - j < w)
    np.testing.assert_allclose(got[keep], tg.evaluate([sc], feed)[0][keep], rtol=1e-12)


@pytest.mark.parametrize("shifted", [False, True], ids=["in_bounds", "shifted_read"])
def test_a_band_no_reader_uses_outside_runs_its_blocks_without_the_guard(shifted):
    """Masked scores read only inside their band (simplify/unread.py): each block of the
    contraction runs as a box without the band's guard, storing values no reader uses
    outside it, when the box's reads stay in bounds; a read ``K[i - j]`` that leaves ``K``
    outside the band keeps the guard. Interpreted (unwritten points NaN), the output is the
    evaluator's either way."""
    from codegen.loopir import Nest
    from codegen.schedule import schedule_steps
    from simplify.unread import written_regions
    n, w = 128, 8
    q, kk, v = _ph((n, 4), "Q"), _ph((n, 4), "K"), _ph((n, 4), "V")
    d, e = tg.reduce_axis(4, "d"), tg.reduce_axis(n, "e")
    band = lambda i, j: tg.all(j <= i, i - j < w)  # noqa: E731
    sc = tg.compute((n, n), lambda i, j: tg.if_then_else(
        band(i, j), tg.sum(q[i, d] * kk[i - j if shifted else j, d], axis=d), 0.0), name="scores")
    out = tg.compute((n, 4), lambda i, f: tg.sum(tg.if_then_else(band(i, e), sc[i, e] * v[e, f], 0.0),
                                                 axis=e), name="out")
    (simple,) = simplify([out])
    regions = written_regions([simple])
    (t,) = [x for x in topo_order([simple]) if x.name == "scores"]
    assert id(t) in regions
    stage = dict(schedule_steps(t, t.op.body, AVX512, region=regions[id(t)]))["split_triangles"]
    nests = [x for x in map(Nest.of, stage.body) if x is not None and x.accumulates]
    assert len(nests) > 4
    guarded = [x for x in nests if x.cond is not None]
    assert (len(guarded) == len(nests)) if shifted else not guarded
    rng = np.random.default_rng(17)
    feed = {x: rng.standard_normal(x.shape) for x in (q, kk, v)}
    got = run(stages_for([simple], AVX512), feed)[id(simple)]
    np.testing.assert_allclose(got, tg.evaluate([out], feed)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["chunks", "concat"])
def test_selects_on_ranges_of_an_axis_are_cut_into_pieces(name):
    """split_select_ranges cuts the element-wise nest of a concat, and of the gradient of blocks
    read along one axis, where its comparisons with constants switch: no piece tests the axis,
    and the gradient's pieces, strip-mined by the 8 its indices divide by, divide no more."""
    from codegen.loopir import Nest, program_text
    from codegen.schedule import schedule_steps
    from te_grad.ir import Compare, ComputeOp, distinct_nodes
    outs, feed = GRAPHS[name]
    cut = 0
    for t in simplify(outs):
        if not isinstance(t.op, ComputeOp) or t.name not in ("dX", "C", "concat"):
            continue
        before = after = None
        for step, stage in schedule_steps(t, t.op.body, AVX512):
            if step == "split_select_ranges":
                after = [n for n in map(Nest.of, stage.body) if n is not None and not n.accumulates]
                break
            before = [n for n in map(Nest.of, stage.body) if n is not None and not n.accumulates]
        if after is None or len(after) <= len(before):
            continue
        cut += 1
        inner = [n.loops[-1].var for n in after]
        for n, v in zip(after, inner):
            assert not any(isinstance(c, Compare) and (c.a is v or c.b is v) for c in distinct_nodes(n.store.value))
        if t.name == "dX":
            divisions = [e for n in after for x in (n.store.value,) + n.store.indices for e in distinct_nodes(x)
                         if getattr(e, "op", None) in ("floordiv", "floormod")]
            assert not divisions and len(after) == 3, program_text([stage])
    assert cut >= 1, cut


def test_plain_keeps_the_meaning_and_drops_every_kind():
    outs, feed = GRAPHS["conv_s2p1d1g1"]
    simplified = simplify(outs)
    stages = stages_for(simplified, AVX512)
    from dataclasses import replace
    flat = [replace(s, body=plain(s.body)) for s in stages]
    assert all(not lp.parallel and type(lp.kind).__name__ == "Serial"
               for s in flat for lp in loops_of_kind(s.body, object))
    want, got = run(stages, feed), run(flat, feed)
    for t in simplified:
        np.testing.assert_array_equal(got[id(t)], want[id(t)])


@pytest.mark.parametrize("machine", [AVX512, TINY], ids=["avx512", "tiny_caches"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_pass_keeps_the_meaning(name, machine):
    """Each scheduling pass, on its own: the stage after every pass of
    codegen.schedule.PASSES interprets to the evaluator's values of its tensor (its inputs
    taken from the evaluator), so a wrong pass is named by the first step that fails."""
    from codegen.schedule import schedule_steps, split_terms
    from te_grad.graph import reads_in, topo_order
    from te_grad.ir import ComputeOp
    from te_grad.lift import normalized_body
    outs, feed = GRAPHS[name]
    tensors = [t for t in topo_order(simplify(outs)) if isinstance(t.op, ComputeOp)]
    steps = 0
    for t in tensors:
        body, lifted = (t.op.body, []) if split_terms(t.op.body) is not None else normalized_body(t)
        for u, b in [(lt, lt.op.body) for lt in lifted] + [(t, body)]:
            reads = list({id(r.tensor): r.tensor for r in reads_in(b) if r.tensor is not u}.values())
            known = dict(zip(map(id, reads), tg.evaluate(reads, feed))) if reads else {}
            want = tg.evaluate([u], feed)[0]
            for step, stage in schedule_steps(u, b, machine):
                got = run([stage], {x: known[id(x)] for x in reads})[id(u)]
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12,
                                           err_msg=f"{name}: {u.name} after {step}")
                steps += 1
    assert steps >= 2 * len(tensors)


def test_code_stays_small_for_a_resize_with_exact_coordinates():
    """Item of scale: an exact-coordinate resize gradient 32 -> 100 was cut into one piece per
    row for each of its clamped taps (1617 lines of loops, 1.5 MB of LLVM IR); pieces of
    little work are refused and single-row guards narrow their loops instead."""
    x = tg.placeholder((1, 8, 32, 32), name="X")
    y = resize_exact(x, 100, 100)
    h = tg.placeholder(y.shape, name="h")
    stages = stages_for(simplify(tg.gradient(y, [x], head=h)), AVX512)
    from codegen.loopir import program_text
    assert len(program_text(stages).splitlines()) < 400
    # no accumulating nest tests a guard that only bounds one output loop by a constant
    from codegen.guard_ranges import _bound
    from codegen.loopir import Nest
    from simplify.affine import conjuncts
    for s in stages:
        for stmt in s.body:
            n = Nest.of(stmt)
            if n is not None and n.accumulates and n.cond is not None:
                outs = {id(lp.var): lp for lp in n.loops}
                assert not any(_bound(c, outs) for c in conjuncts(n.cond))
