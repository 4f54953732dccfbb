"""A tensor the simplifier must keep as it is (read at a data-dependent index, so its read is
checked at run time; the forward tensors of a gradient) still reads the simplified forms of
its producers: otherwise the unsimplified graph behind it stays alive, and a kernel computes
the forward twice, once with its guards (a model's logits read at the labels by a
cross-entropy kept every convolution of the model in both forms)."""
import numpy as np

import codegen
from codegen.loopir import program_text
import te_grad as tg
from te_grad.graph import topo_order
from simplify import simplify
from simplify.rewrite import simplify_graph


def _model():
    X = tg.placeholder((4, 2, 5, 5), name="X")
    W = tg.placeholder((3, 2, 3, 3), name="W")
    labels = tg.placeholder((4,), dtype="int64", name="labels")
    C = tg.nn.conv2d(X, W, padding=1)  # a guarded read the simplifier turns into bounds
    h, w = tg.reduce_axis(5, "h"), tg.reduce_axis(5, "w")
    logits = tg.compute((4, 3), lambda i, c: tg.sum(C[i, c, h, w], axis=[h, w]), name="logits")
    loss = tg.nn.softmax_cross_entropy(logits, labels)  # reads logits[i, labels[i]]
    (dW,) = tg.gradient(loss, [W])
    return [loss, dW], [X, W, labels], C


def test_the_forward_behind_a_kept_tensor_is_simplified_once():
    outs, _, conv = _model()
    new = simplify(outs)
    convs = [t for t in topo_order(new) if t.name == conv.name]
    assert len(convs) == 1, [tg.show(t) for t in convs]
    assert "if_then_else" not in tg.show(convs[0]).splitlines()[-1]  # the padding guard became bounds


def test_kept_tensors_whose_producers_are_kept_stay_the_same_objects():
    outs, _, conv = _model()
    forward = topo_order([outs[0]])
    new = simplify_graph(forward, {id(t) for t in forward})
    assert all(new[id(t)] is t for t in forward)


def test_the_kernel_computes_each_forward_tensor_once_and_the_oracles_values():
    outs, inputs, conv = _model()
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(outs, inputs)
    names = [s.stage.tensor.name for s in kern.stages]
    assert names.count(conv.name) == 1 and names.count("logits") == 1, names
    (stage,) = [s.stage for s in kern.stages if s.stage.tensor.name == conv.name]
    assert "if_then_else" not in program_text([stage])  # the simplified convolution, not the guarded one
    rng = np.random.default_rng(0)
    feed = {inputs[0]: rng.standard_normal((4, 2, 5, 5)).astype(np.float32),
            inputs[1]: rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
            inputs[2]: np.array([0, 2, 1, 2], dtype=np.int64)}
    got = kern(*feed.values())
    for g, want in zip(got, tg.evaluate(outs, feed)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
