"""Rich display and inspection: HTML of tensors, results and kernels; iteration domains."""
import te_grad as tg


def _conv():
    X = tg.placeholder((1, 2, 9, 9), name="X")
    W = tg.placeholder((3, 2, 3, 3), name="W")
    return X, W, tg.nn.conv2d(X, W, stride=2, padding=1)


def test_tensor_html_shows_formula_and_dependencies():
    X, W, Y = _conv()
    h = Y._repr_html_()
    assert "conv2d[n, c, h, w] = sum(" in h and "<details>" in h and "input X" in h


def test_result_html_compares_raw_and_simplified():
    X, W, Y = _conv()
    res = tg.differentiate(Y, [X, W])
    h = res._repr_html_()
    assert "raw vector-Jacobian products" in h
    for x, g, raw in zip(res.inputs, res.gradients, res.raw):
        assert f"{tg.iterations(g):,}" in h and f"{tg.iterations(raw):,}" in h
        assert tg.iterations(raw) > 50 * tg.iterations(g)


def test_kernel_html_has_loops_ir_and_asm():
    X, W, Y = _conv()
    k = tg.build([Y], inputs=[X, W])
    h = k._repr_html_()
    assert "parallel for" in h and "LLVM IR" in h and "assembly" in h and "define" in h


def test_iteration_domains_are_isl_sets():
    X, W, Y = _conv()
    res = tg.differentiate(Y, [X, W])
    (raw,) = tg.domain(res.raw[0])
    (simp,) = tg.domain(res[0])
    assert "2h = 1 + j2 - ry" in raw.isl  # the raw form keeps the index equality
    assert " ry" not in simp.isl and "2h <= 1 + j2" in simp.isl  # solved away by isl
    assert "iteration domain of dX" in repr(simp) and "<pre" in simp._repr_html_()
