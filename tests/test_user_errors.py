"""Newcomer mistakes end in a tg.UserError that names what is wrong and what to write.

Each test here raised a raw exception (KeyError, numpy's ValueError, BadZipFile, a
gcc error) or silently did the wrong thing before.
"""
import numpy as np
import pytest

import te_grad as tg

RNG = np.random.default_rng(61)


def user_error(fn, *needles):
    """Call ``fn``; it must raise a UserError whose message contains every needle."""
    with pytest.raises(tg.TeGradError) as info:
        fn()
    err = info.value
    assert isinstance(err, tg.UserError), type(err)
    msg = str(err)
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


# ---------------------------------------------------------------------------
# VJP.run_backward: one value per input, one head per output
# ---------------------------------------------------------------------------


def _two_input_vjp():
    a = tg.placeholder((4, 3), name="A", dtype="float64")
    b = tg.placeholder((4, 3), name="B", dtype="float64")
    out = tg.compute((4, 3), lambda i, j: a[i, j] * b[i, j], name="prod")
    vjp = tg.build_vjp([out], [a, b])
    av, bv = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    _, res = vjp.run_forward(av, bv)
    return vjp, res, av, bv


def test_run_backward_with_an_input_missing_names_it():
    vjp, res, av, bv = _two_input_vjp()
    head = np.ones((4, 3))
    user_error(lambda: vjp.run_backward(res, [av], [head]), "missing B", "2 input values", "1 given")
    ga, gb = vjp.run_backward(res, [av, bv], [head])  # the right call still works
    np.testing.assert_allclose(ga, bv)
    np.testing.assert_allclose(gb, av)


def test_run_backward_with_extra_heads_or_inputs_is_refused():
    vjp, res, av, bv = _two_input_vjp()
    head = np.ones((4, 3))
    user_error(lambda: vjp.run_backward(res, [av, bv], [head, head]),
               "1 heads (one per output) expected", "2 given", "1 too many")
    user_error(lambda: vjp.run_backward(res, [av, bv], []), "missing prod")
    user_error(lambda: vjp.run_backward(res, [av, bv, bv], [head]), "1 too many")
