"""Views in the importer's translation (te_grad/frontends/views.py): a view of a view is one view,
its indices normalized over the extents, and it reads the same elements as the chain."""
import numpy as np

import te_grad as tg
from te_grad import nn
from te_grad.frontends.views import composed
from te_grad.ir import ComputeOp, Read, Var
from simplify.linear import normalize


def _is_view_of(t, source):
    return isinstance(t.op, ComputeOp) and isinstance(t.op.body, Read) and t.op.body.tensor is source


def test_split_heads_and_merge_back_reads_the_source_at_affine_indices():
    """nn.MultiheadAttention's head split: (seq, batch, 128) viewed as (seq, 4 * batch, 32),
    transposed, viewed as (batch, 4, seq, 32): one view of the source, reading x[s, b, 32 h + d]."""
    for batch in (16, tg.var("B")):
        x = tg.placeholder((8, batch, 128), name="x")
        v = composed(nn.reshape(x, (8, batch * 4, 32)))
        t = composed(nn.transpose(v, (1, 0, 2)))
        w = composed(nn.reshape(t, (batch, 4, 8, 32)))
        assert _is_view_of(w, x)
        text = tg.show(w)
        assert "//" not in text and "%" not in text, text
    x = tg.placeholder((8, 3, 128), name="x")
    chain = nn.reshape(nn.transpose(nn.reshape(x, (8, 12, 32)), (1, 0, 2)), (3, 4, 8, 32))
    w = composed(nn.reshape(composed(nn.transpose(composed(nn.reshape(x, (8, 12, 32))), (1, 0, 2))), (3, 4, 8, 32)))
    xv = np.random.default_rng(0).standard_normal((8, 3, 128)).astype(np.float32)
    want, got = tg.evaluate([chain, w], {x: xv})
    assert np.array_equal(want, got) and np.array_equal(got, xv.reshape(8, 12, 32).transpose(1, 0, 2).reshape(3, 4, 8, 32))


def test_a_reshape_that_does_not_compose_to_affine_indices_keeps_them_and_its_values():
    x = tg.placeholder((6, 10), name="x")
    w = composed(nn.reshape(composed(nn.transpose(x, (1, 0))), (4, 15)))   # a transposed flat order
    assert _is_view_of(w, x)
    xv = np.arange(60, dtype=np.float32).reshape(6, 10)
    assert np.array_equal(tg.evaluate([w], {x: xv})[0], xv.T.reshape(4, 15))
    # one view alone, or a view of a computed tensor, is left as it is
    y = nn.relu(x)
    assert composed(nn.transpose(y, (1, 0))).op.body.tensor is y


def test_normalize_folds_division_by_what_it_knows_of_the_ranges():
    b, h, d = Var("b"), Var("h"), Var("d")
    e = ((b * 4 + h) * 32 + d) // 128
    ranges = {id(h): (0, 3), id(d): (0, 31)}
    assert normalize(e, ranges).same_as(normalize(b))
    assert normalize(((b * 4 + h) * 32 + d) % 128, ranges).same_as(normalize(h * 32 + d))
    assert not normalize(e).same_as(normalize(b))                       # without the ranges: kept
    assert not normalize(e, {id(h): (0, 4), id(d): (0, 31)}).same_as(normalize(b))   # h = 4 would carry
