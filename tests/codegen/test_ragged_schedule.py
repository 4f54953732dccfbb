"""Ragged (CSR) loops scheduled: segment softmax in one pass over the edges, scatters over
CSR segments split among threads, values against the oracle."""
import numpy as np
import pytest

import te_grad as tg
from tests.oracle.test_ragged_oracle import random_csr


def test_segment_softmax_is_one_pass_over_the_edges():
    """Each edge is visited once per stage: not once per (segment, edge) pair."""
    S, E = 50, 400
    rowptr = tg.placeholder((S + 1,), dtype="int64", name="rowptr")
    scores = tg.placeholder((E,), dtype="float64", name="scores")
    alpha = tg.nn.segment_softmax(scores, rowptr)
    # ragged=1 counts each ragged loop as one trip per point: the max, the sum, the scatter
    assert tg.iterations([alpha], ragged=1) <= 3 * S
    rng = np.random.default_rng(0)
    rp, _ = random_csr(rng, S, E)
    sv = rng.standard_normal(E)
    got = tg.build([alpha], inputs=[rowptr, scores], threads=2)(rp, sv)
    np.testing.assert_allclose(got, tg.evaluate([alpha], {rowptr: rp, scores: sv})[0], rtol=1e-12, atol=1e-15)
