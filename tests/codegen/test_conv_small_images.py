"""Convolutions whose images are tiny (ResNet-18's last layers on CIFAR-size inputs: 2 x 2 and
1 x 1): the vector lanes run along the output channels, the weights are read from a copy with
the output channels last (one vector per tap and input channel) and the batch is jammed into
the register block, instead of lanes along a batch or an image row of 1 or 2 elements
(gathers, or no register block at all). The decisions are read from the loop IR; the values
are checked against the reference evaluator, after every schedule pass (loop interpreter) and
from the compiled kernel."""
import numpy as np
import pytest

import te_grad as tg
from te_grad import nn
from codegen import packing
from codegen.interpret import run
from codegen.loop_order import panel_width
from codegen.loopir import RegisterBlock, RegisterBlocked, loops, loops_of_kind
from codegen.machine import Machine
from codegen.schedule import schedule_steps, split_terms, stages_for
from te_grad.graph import reads_in
from te_grad.lift import normalized_body
from simplify import simplify

AVX512 = Machine(vector_bits=512, vector_registers=32, l1_bytes=48 * 1024, l2_bytes=2 << 20)
AVX2 = Machine(vector_bits=256, vector_registers=16, l1_bytes=32 * 1024, l2_bytes=1 << 20)

#: (batch, in channels, image, out channels, kernel, stride, padding): the output images are
#: 1 x 1 (a 1 x 1 image under a padded 3 x 3 window, and a 2 x 2 one under a stride-2
#: window) or 2 x 2 (a 2 x 2 image, padded)
SMALL = {"1x1": (2, 4, 1, 8, 3, 1, 1), "2x2_s2": (2, 4, 2, 8, 3, 2, 1), "2x2": (2, 4, 2, 8, 3, 1, 1)}
#: ResNet-18's layer3 and layer4 convolutions at CIFAR size
RESNET = {"layer4_conv2": (32, 512, 1, 512, 3, 1, 1), "layer4_conv1": (32, 256, 2, 512, 3, 2, 1),
          "layer3_conv2": (32, 256, 2, 256, 3, 1, 1)}


def _conv(shape, dtype="float64"):
    n, c, size, o, k, stride, pad = shape
    x = tg.placeholder((n, c, size, size), name="X", dtype=dtype)
    w = tg.placeholder((o, c, k, k), name="W", dtype=dtype)
    return x, w, nn.conv2d(x, w, stride=stride, padding=pad)


def _with_gradients(shape):
    x, w, y = _conv(shape)
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    outs = [y] + list(tg.gradient(y, [x, w], head=head))
    rng = np.random.default_rng(3)
    feed = {t: rng.standard_normal(t.shape) for t in (x, w, head)}
    return outs, feed


def _blocks(stage):
    return [RegisterBlock.of(lp) for lp in loops_of_kind(stage.body, RegisterBlocked)]


@pytest.mark.parametrize("name", sorted(RESNET))
@pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_lanes_run_along_the_output_channels_of_a_tiny_image(name, machine):
    x, w, y = _conv(RESNET[name], "float32")
    stages = stages_for(simplify([y]), machine)
    conv = next(s for s in stages if s.tensor.name == "conv2d")
    channel = conv.tensor.op.axes[1]
    blocks = _blocks(conv)
    assert blocks and all(b.var is channel for b in blocks), [b.var.name for b in blocks]
    assert all(b.var is not conv.parallel_axis for b in blocks)
    # the batch is jammed into the blocks: each input element is broadcast to several rows;
    # the other blocks take the batch rows past the last whole jammed block, fewer than its factor
    batch = conv.tensor.op.axes[0]
    jammed = [b for b in blocks if any(j.var is batch for j in b.jams)]
    assert jammed
    factor = max(j.factor for b in jammed for j in b.jams if j.var is batch)
    rest = [lp for lp in loops(conv.body) if lp.var is batch and lp.parallel
            and any(isinstance(inner.kind, RegisterBlocked) for inner in loops(lp.body))]
    assert len(jammed) + len(rest) == len(blocks)
    assert all(lp.hi.value - lp.lo.value < factor for lp in rest)
    # the weights come from a copy with the output channels last (in panels of 16 channels:
    # a step of a reduce loop would move 1 KiB in it): unit-stride lanes
    packed = [r for s in stages if s is conv for b in blocks for r in reads_in(b.store.value)
              if r.tensor.name.startswith("W_packed")]
    assert packed and all(panel_width(r.indices, channel) == 16 for r in packed)
    panels = next(s for s in stages if s.tensor.name == "W_packed_panels")
    assert [r.tensor.name for r in reads_in(panels.tensor.op.body)] == ["W_packed"]


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("copies", [False, True], ids=["default", "every_copy"])
def test_tiny_images_interpret_and_run_to_the_evaluator(name, copies):
    outs, feed = _with_gradients(SMALL[name])
    want = tg.evaluate(outs, feed)
    simplified = simplify(outs)
    with packing.using(packing.EVERY_COPY if copies else packing.DEFAULT):
        got = run(stages_for(simplified, AVX512), feed)
        kern = tg.build(outs, list(feed), machine=AVX512 if copies else None)
    for t, w in zip(simplified, want):
        np.testing.assert_allclose(got[id(t)], w, rtol=1e-12, atol=1e-12, err_msg=f"{name}: {t.name}")
    for g, w in zip(kern(*feed.values()), want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_pass_keeps_the_meaning_on_tiny_images(name):
    """The stage after every schedule pass interprets to the evaluator's values, the weights
    read from their copy with the channels last."""
    outs, feed = _with_gradients(SMALL[name])
    steps = 0
    with packing.using(packing.EVERY_COPY):
        stages = stages_for(simplify(outs), AVX512)
        assert any(s.tensor.name == "W_packed" for s in stages)
        # each tensor's values (the copies' included) from the reference evaluator
        computed = {id(s.tensor): tg.evaluate([s.tensor], feed)[0] for s in stages}
        for s in stages:
            u = s.tensor
            body = u.op.body if split_terms(u.op.body) is not None else normalized_body(u)[0]
            reads = list({id(r.tensor): r.tensor for r in reads_in(body) if r.tensor is not u}.values())
            known = {x: feed[x] if x in feed else computed[id(x)] for x in reads}
            for step, stage in schedule_steps(u, body, AVX512):
                got = run([stage], known)[id(u)]
                np.testing.assert_allclose(got, computed[id(u)], rtol=1e-12, atol=1e-12,
                                           err_msg=f"{name}: {u.name} after {step}")
                steps += 1
    assert steps >= 2 * len(stages)
