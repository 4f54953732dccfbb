"""tg.row_gradient: a scatter gradient kept as (ids, rows), checked against the dense gradient.

The dense gradient itself is checked against float64 finite differences by
the nn gradient tests; here (ids, rows) scattered back must equal it, through
the evaluator and through compiled kernels.
"""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn
from te_grad.testing import check_gradients


def _table_and_ids(rows=20, cols=6, ids_shape=(9,), seed=0):
    rng = np.random.default_rng(seed)
    table = tg.placeholder((rows, cols), dtype="float64", name="table")
    ids = tg.placeholder(ids_shape, dtype="int64", name="ids")
    feed = {table: rng.standard_normal((rows, cols)),
            ids: rng.integers(0, rows, size=ids_shape).astype("int64")}
    feed[ids].flat[0] = feed[ids].flat[-1]  # a repeated id: its rows add up
    return table, ids, feed


@pytest.mark.parametrize("ids_shape", [(9,), (3, 4)])
def test_embedding_rows_scatter_back_to_the_dense_gradient(ids_shape):
    table, ids, feed = _table_and_ids(ids_shape=ids_shape)
    y = nn.embedding(table, ids)
    head = tg.placeholder(y.shape, dtype="float64", name="head")
    feed[head] = np.random.default_rng(1).standard_normal(y.shape)
    (dense,) = tg.gradient(y, [table], head=head)
    rg = tg.row_gradient(dense)
    assert rg.ids.shape == ids_shape and rg.rows.shape == ids_shape + (6,)
    want = tg.evaluate([dense], feed)[0]
    ids_v, rows_v = tg.evaluate([rg.ids, rg.rows], feed)
    np.testing.assert_allclose(rg.to_dense(ids_v, rows_v), want, rtol=1e-12, atol=1e-12)
    kern = tg.build([rg.ids, rg.rows], inputs=[table, ids, head])
    ids_c, rows_c = kern(feed[table], feed[ids], feed[head])
    np.testing.assert_array_equal(ids_c, ids_v)
    np.testing.assert_allclose(rg.to_dense(ids_c, rows_c), want, rtol=1e-12, atol=1e-12)


def test_rows_of_a_loss_through_an_embedding_match_finite_differences():
    table, ids, feed = _table_and_ids()
    emb = nn.embedding(table, ids)
    k = tg.reduce_axis((0, 6), "k")
    i = tg.reduce_axis((0, 9), "i")
    loss = tg.compute((), lambda: tg.sum(tg.tanh(emb[i, k]) * emb[i, k], axis=[i, k]), name="loss")
    check_gradients(loss, [table], feed)  # the dense gradient against float64 finite differences
    (dense,) = tg.gradient(loss, [table])
    rg = tg.row_gradient(dense)
    ids_v, rows_v = tg.evaluate([rg.ids, rg.rows], feed)
    np.testing.assert_allclose(rg.to_dense(ids_v, rows_v), tg.evaluate([dense], feed)[0], rtol=1e-12)


def test_a_gradient_with_a_dense_part_is_refused():
    table, ids, _ = _table_and_ids()
    y = tg.compute((9, 6), lambda i, j: table[ids[i], j] + table[i, j], name="y")
    (dense,) = tg.gradient(y, [table])
    with pytest.raises(tg.UserError, match="not a scatter"):
        tg.row_gradient(dense)


def test_a_scatter_over_part_of_a_row_is_refused():
    table, ids, _ = _table_and_ids()
    y = tg.compute((9, 3), lambda i, j: table[ids[i], j + 1], name="y")
    (dense,) = tg.gradient(y, [table])
    with pytest.raises(tg.UserError, match="row_gradient: index 1"):
        tg.row_gradient(dense)
