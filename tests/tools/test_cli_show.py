"""``python -m te_grad show OP``: formulas, exact counts, loop nests, and clear errors."""
import re

import pytest

import te_grad as tg
from te_grad.tools.cli import SHOW_OPS, main


def run(capsys, *argv):
    rc = main(["show", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def counts(out):
    """{row name: (raw, simplified)} from the iteration table."""
    rows = {}
    for line in out.split("## innermost iterations (exact)")[1].splitlines():
        m = re.match(r"(\S+)\s+([\d,]+)\s+([\d,]+)\s", line + " ")
        if m:
            rows[m.group(1)] = tuple(int(g.replace(",", "")) for g in m.groups()[1:])
    return rows


def test_strided_conv2d(capsys):
    rc, out, err = run(capsys, "conv2d", "--param", "stride=2", "--param", "padding=1")
    assert rc == 0 and err == ""
    assert out.startswith("# conv2d(X, W, stride=2, padding=1)")
    assert "conv2d[n, c, h, w] = sum(if_then_else(" in out  # the forward, with its padding guard
    assert "dX[j0, j1, j2, j3] = sum(dY[0, c, h, w] * W[" in out  # the simplified gradient
    grad_part = out.split("## gradients")[1].split("## innermost")[0]
    assert "if_then_else" not in grad_part and " if " not in grad_part  # no guard, no filter left
    # the counts are those of the same op built through the API
    X = tg.placeholder((1, 4, 8, 8), name="X")
    W = tg.placeholder((4, 4, 3, 3), name="W")
    Y = tg.nn.conv2d(X, W, stride=2, padding=1)
    res = tg.differentiate(Y, [X, W], head=tg.placeholder(Y.shape, name="dY"))
    rows = counts(out)
    assert rows["dX"] == (tg.iterations(res.raw[0]), tg.iterations(res[0]))
    assert rows["dW"] == (tg.iterations(res.raw[1]), tg.iterations(res[1]))
    assert re.search(rf"forward\s+{tg.iterations(Y):,}", out)
    assert "compiled kernels" not in out


def test_compile_prints_the_loop_nests(capsys):
    rc, out, _ = run(capsys, "dense", "--param", "bias=True", "--compile")
    assert rc == 0
    assert out.startswith("# dense(X, W, b)")
    assert "db[" in out
    fwd, bwd = out.split("## compiled kernels")[1].split("# backward:")
    assert "for (" in fwd and "X[i, k] * W[j, k]" in fwd
    assert "for (" in bwd and "dX[" in bwd and "dW[" in bwd and "db[" in bwd


def test_input_shapes_and_tuple_params(capsys):
    rc, out, _ = run(capsys, "layer_norm", "--param", "X=(2, 3, 4)", "--param", "axis=(1, 2)")
    assert rc == 0
    assert "input X: float32[2, 3, 4]" in out and "input gamma: float32[3, 4]" in out
    assert "dgamma[j0, j1] = sum(" in out
    rc, out, _ = run(capsys, "concat", "--param", "axis=1")
    assert rc == 0 and "input B: float32[2, 5]" in out and "# concat(A, B, axis=1)" in out


def test_scatter_and_several_outputs(capsys):
    rc, out, _ = run(capsys, "embedding")
    assert rc == 0
    assert "dtable = 0; dtable[ids[i], j] += dY[i, j]" in out
    assert counts(out)["dtable"][1] == 24
    rc, out, _ = run(capsys, "split", "--param", "indices_or_sections=3")
    assert rc == 0 and "heads dY0, dY1, dY2" in out and "split_2[" in out


@pytest.mark.parametrize("op", sorted(SHOW_OPS))
def test_every_op_shows(capsys, op):
    rc, out, err = run(capsys, op)
    assert rc == 0, err
    if op in ("arange", "one_hot", "argmax", "argmin"):  # no float input, or an integer output
        assert "## forward" in out and "nothing to differentiate" in out
        return
    assert "## forward" in out and "## innermost iterations (exact)" in out
    rows = counts(out)
    assert rows["all"][1] <= rows["all"][0]  # simplifying never costs more


def test_every_nn_op_is_known():
    helpers = {"broadcast_shape", "conv2d_output_shape"}
    assert set(tg.nn.__all__) - helpers == set(SHOW_OPS)


def test_unknown_op_lists_the_known_ones(capsys):
    rc, out, err = run(capsys, "conv3d")
    assert rc == 2 and out == ""
    assert "unknown op 'conv3d'" in err
    for op in SHOW_OPS:
        assert op in err


@pytest.mark.parametrize("args, message", [
    (["conv2d", "--param", "stride"], "NAME=VALUE"),
    (["conv2d", "--param", "=2"], "NAME=VALUE"),
    (["conv2d", "--param", "stride=two"], "not a Python literal"),
    (["conv2d", "--param", "strde=2"], "its parameters are stride, padding, dilation"),
    (["conv2d", "--param", "stride=0"], "stride must be >= 1"),
    (["dense", "--param", "X=(0, 4)"], "shape of input X"),
    (["dense", "--param", "bias=1"], "True or False"),
    (["matmul", "--param", "A=(3, 5)"], "inner dimensions differ"),
])
def test_bad_params_exit_2(capsys, args, message):
    rc, out, err = run(capsys, *args)
    assert rc == 2
    assert err.startswith("error: ") and message in err


def test_demo_and_help_still_there(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["show", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--param NAME=VALUE" in out and "conv2d_transpose" in out
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert "demo" in capsys.readouterr().out
