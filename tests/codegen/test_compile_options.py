"""The compile options: one object for every setting of a build (codegen/options.py).

Defaults from the environment (read in one place), explicit options, keywords overriding
them, the scoped ``with compile_options(...)``; the schedule passes switched off by name,
each leaving correct kernels (checked against the reference evaluator in float64) and
visible in ``kern.loops``; and a deliberately broken pass named by bisection."""
from dataclasses import replace

import numpy as np
import pytest

import te_grad as tg
from codegen import disk_cache, jit, kernel as kernel_module, packing, schedule, team
from codegen.machine import Machine
from codegen.options import CompileOptions, compile_options, current_options
from codegen.schedule import PASSES, bisect, optional_passes
from te_grad import nn
from te_grad.checking import enabled as verifying
from te_grad.formulations import conv_pad_stage_s2, resize_exact

ENV = {"TE_GRAD_NUM_THREADS": "3", "TE_GRAD_VERIFY": "1", "TE_GRAD_JIT_CACHE": "5",
       "TE_GRAD_COMPILE_WORKER": "0", "TE_GRAD_SPIN_US": "7", "TE_GRAD_CACHE": "0"}


def test_options_from_the_environment_and_explicit(monkeypatch, tmp_path):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TE_GRAD_CACHE_DIR", str(tmp_path))
    env = CompileOptions.from_env()
    assert (env.threads, env.verify, env.jit_cache, env.compile_worker, env.spin_us, env.disk_cache,
            env.cache_dir) == (3, True, 5, False, 7.0, False, str(tmp_path))
    # the deep readers see the environment's defaults through the options
    assert current_options() == env
    assert (kernel_module.default_threads(), jit.cache_limit(), team.spin_seconds(), disk_cache.enabled(),
            disk_cache.directory(), verifying()) == (3, 5, 7e-6, False, str(tmp_path), True)
    # explicit options ignore the environment
    plain = CompileOptions()
    assert (plain.threads, plain.verify, plain.jit_cache, plain.compile_worker, plain.spin_us,
            plain.disk_cache, plain.cache_dir) == (None, False, 64, True, 2000.0, True, None)
    with compile_options(jit_cache=2, spin_us=0, disk_cache=True, verify=False, threads=2,
                         cache_dir=str(tmp_path / "other")) as inner:
        assert current_options() is inner and inner.compile_worker is False  # the rest from outside
        assert (kernel_module.default_threads(), jit.cache_limit(), team.spin_seconds(), disk_cache.enabled(),
                disk_cache.directory(), verifying()) == (2, 2, 0.0, True, str(tmp_path / "other"), False)
        with compile_options(jit_cache=9):
            assert jit.cache_limit() == 9 and kernel_module.default_threads() == 2
        assert jit.cache_limit() == 2
    assert jit.cache_limit() == 5
    # the environment changes the defaults, read again
    monkeypatch.setenv("TE_GRAD_JIT_CACHE", "11")
    assert jit.cache_limit() == 11
    monkeypatch.setenv("TE_GRAD_NUM_THREADS", "lots")
    with pytest.raises(tg.UserError, match="TE_GRAD_NUM_THREADS"):
        CompileOptions.from_env()


def test_bad_options_are_user_errors():
    with pytest.raises(tg.UserError, match="threads must be a positive int"):
        CompileOptions(threads=0)
    with pytest.raises(tg.UserError, match="disabled_passes must be a set"):
        CompileOptions(disabled_passes="register_blocking")
    with pytest.raises(tg.UserError, match="unknown compile option.*fastmath"):
        CompileOptions().replace(fastmath=False)
    with pytest.raises(tg.UserError, match="unknown compile option.*fastmath"):
        with compile_options(fastmath=False):
            pass
    with pytest.raises(tg.UserError, match="thresholds must be"):
        CompileOptions(thresholds={"min_work": 0})


def _dense(n=24, dtype="float64"):
    x = tg.placeholder((n, 32), dtype=dtype, name="X")
    w = tg.placeholder((40, 32), dtype=dtype, name="W")
    y = nn.dense(x, w)
    rng = np.random.default_rng(0)
    return [y], [x, w], {x: rng.standard_normal(x.shape).astype(dtype), w: rng.standard_normal(w.shape).astype(dtype)}


def test_keywords_override_the_options_object():
    outs, inputs, _ = _dense()
    base = CompileOptions(fast_math=False, threads=2, disk_cache=False)
    kern = tg.build(outs, inputs, options=base)
    assert (kern.fast_math, kern.threads, kern.options.disk_cache) == (False, 2, False)
    kern = tg.build(outs, inputs, options=base, threads=3, fast_math=True)
    assert (kern.fast_math, kern.threads) == (True, 3)
    assert kern.options.machine is not None  # resolved: part of the cache key
    with compile_options(threads=1):
        assert tg.build(outs, inputs).threads == 1
        assert tg.build(outs, inputs, options=base).threads == 2  # an explicit object wins
        assert tg.build(outs, inputs, threads=4).threads == 4
    with pytest.raises(tg.UserError, match="unknown keyword.*fastmath"):
        tg.build(outs, inputs, fastmath=False)
    with pytest.raises(tg.UserError, match="options must be a codegen.options.CompileOptions"):
        tg.build(outs, inputs, options={"fast_math": False})


def test_pass_names_are_checked():
    outs, inputs, _ = _dense()
    with pytest.raises(tg.UserError, match="unknown schedule pass 'register_block'.*block_registers"):
        tg.build(outs, inputs, disabled_passes={"register_block"})
    for needed in ("order_elementwise", "order_reductions", "loop_order", "decide_blocks"):
        with pytest.raises(tg.UserError, match="cannot be disabled"):
            tg.build(outs, inputs, disabled_passes={needed})
    assert [p.name for p in PASSES if p.needed] == ["order_elementwise", "order_reductions", "decide_blocks"]
    # the module's name switches off its optional pass only, not the lowering decision beside it
    kern = tg.build(outs, inputs, disabled_passes={"register_blocking"})
    assert ": in vector registers across the loops below" not in kern.loops
    assert all(p.promise for p in PASSES) and len({p.name for p in PASSES}) == len(PASSES)


def _graphs():
    """Small float64 graphs (forward and gradient) that, between them, give every pass work."""
    rng = np.random.default_rng(1)

    def ph(shape, name, dtype="float64"):
        return tg.placeholder(shape, dtype=dtype, name=name)

    def with_gradient(y, inputs):
        head = ph(y.shape, "head", y.dtype)
        outs = [y] + list(tg.gradient(y, inputs, head=head))
        return outs, inputs + [head], {t: rng.standard_normal(t.shape).astype(t.dtype) for t in inputs + [head]}

    x, w = ph((2, 3, 9, 9), "X"), ph((4, 3, 3, 3), "W")
    yield "conv_padded", with_gradient(nn.conv2d(x, w, padding=1), [x, w])
    yield "conv_strided", with_gradient(nn.conv2d(x, w, stride=2), [x, w])
    x = ph((2, 2, 8, 8), "X")
    yield "max_pool_3_2", with_gradient(nn.max_pool2d(x, 3, 2), [x])
    x, w = ph((12, 20), "X"), ph((18, 20), "W")
    yield "dense", with_gradient(nn.dense(x, w), [x, w])
    x = ph((6, 10), "X")
    k = tg.reduce_axis((0, 10), "k")
    yield "cumsum", with_gradient(tg.compute((6, 10), lambda i, j: tg.sum(x[i, k], axis=k, where=k <= j),
                                             name="cumsum"), [x])
    x = ph((64, 72), "X", "float32")  # 8 x 8 blocks transpose 32-bit values (exactly)
    yield "transpose", with_gradient(tg.compute((72, 64), lambda i, j: x[j, i] * 2.0, name="T"), [x])
    x = ph((5, 6), "X")
    yield "upsample", with_gradient(tg.compute((10, 12), lambda i, j: x[i // 2, j // 2] * (1.0 + (j % 2)),
                                               name="up"), [x])
    x = ph((1, 2, 6, 6), "X")
    yield "resize", with_gradient(resize_exact(x, 11, 11), [x])
    strided = conv_pad_stage_s2("float64", small=True)  # a stride-2 convolution over a padding stage
    yield "conv_pad_stage_s2", with_gradient(strided.output, list(strided.inputs))
    # causal attention: a triangle of the score matrix and of the sum over it (split_triangles)
    q, kk, v = ph((36, 4), "Q"), ph((36, 4), "K"), ph((36, 4), "V")
    d, e = tg.reduce_axis(4, "d"), tg.reduce_axis(36, "e")
    sc = tg.compute((36, 36), lambda i, j: tg.if_then_else(j <= i, tg.sum(q[i, d] * kk[j, d], axis=d), -np.inf),
                    name="scores")
    p = nn.softmax(sc)
    yield "causal_attention", with_gradient(
        tg.compute((36, 4), lambda i, f: tg.sum(p[i, e] * v[e, f], axis=e), name="attn"), [q, kk, v])
    # a CSR aggregation: its gradients are scatters over ragged loops (order_ragged_scatter)
    rowptr, src, x, a = ph((7,), "rowptr", "int64"), ph((13,), "src", "int64"), ph((6, 4), "X"), ph((13,), "A")

    def agg(v, f):
        e = tg.reduce_axis((rowptr[v], rowptr[v + 1]), "e")
        return tg.sum(a[e] * x[src[e], f], axis=e)

    y = tg.compute((6, 4), agg, name="agg")
    outs, inputs, feed = with_gradient(y, [x, a])
    feed.update({rowptr: np.array([0, 2, 2, 7, 9, 12, 13]), src: rng.integers(0, 6, 13)})
    yield "csr", (outs, [rowptr, src] + inputs, feed)


GRAPHS = dict(_graphs())
#: every copy, so that packing has work on these small graphs
SMALL = CompileOptions(thresholds=packing.EVERY_COPY, disk_cache=False)


#: the stock thresholds: no copy on graphs this small (the passes then see the operands)
STOCK = CompileOptions(disk_cache=False)
#: caches so small that every contraction is tiled
TINY = STOCK.replace(machine=Machine(vector_bits=256, vector_registers=16, l1_bytes=1024, l2_bytes=2048))


def _loops(name, disabled=(), options=SMALL):
    outs, inputs, _ = GRAPHS[name]
    return tg.build(outs, inputs, options=options.replace(disabled_passes=frozenset(disabled))).loops


@pytest.mark.parametrize("options", [SMALL, STOCK, TINY], ids=["every_copy", "stock", "tiny_caches"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_each_pass_switched_off_still_computes_the_right_numbers(name, options):
    outs, inputs, feed = GRAPHS[name]
    want = tg.evaluate(outs, feed)
    full = tg.build(outs, inputs, options=options)
    for off in optional_passes():
        kern = tg.build(outs, inputs, options=options.replace(disabled_passes=frozenset({off})))
        for got, w, t in zip(kern(*[feed[t] for t in inputs]), want, outs):
            np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-10, err_msg=f"{name}: {t.name} without {off}")
        assert kern.options.disabled_passes == {off} and full.options.disabled_passes == set()


def test_switching_a_pass_off_shows_in_the_loops():
    """The graphs above give every optional pass something to do: switching it off changes
    the loops of at least one (so the test above checks each pass, not a no-op)."""
    changed = set()
    for off in optional_passes():
        for name in GRAPHS:
            if any(_loops(name, {off}, o) != _loops(name, (), o) for o in (SMALL, STOCK, TINY)):
                changed.add(off)
                break
    assert changed == set(optional_passes())
    # what each switch removes, as kern.loops shows it
    assert "in vector registers" in _loops("dense")
    assert "in vector registers" not in _loops("dense", {"register_blocking"})
    assert "_packed" in _loops("dense") and "_packed" not in _loops("dense", {"packing"})
    with_scan, without = _loops("cumsum"), _loops("cumsum", {"scans"})
    assert "a register carried along" in with_scan and "a register carried along" not in without
    # a module's name switches off its passes
    assert _loops("conv_strided", {"congruence"}) == _loops("conv_strided", {"interleave_classes", "split_classes"})


def test_the_disk_cache_tells_options_apart(monkeypatch, tmp_path):
    """A build with a pass switched off is not the cached default build (nor the reverse)."""
    monkeypatch.setenv("TE_GRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TE_GRAD_CACHE", "1")
    outs, inputs, _ = _dense()
    every = packing.EVERY_COPY
    first = tg.build(outs, inputs, thresholds=every).loops
    assert "in vector registers" in first
    again = tg.build(outs, inputs, thresholds=every, disabled_passes={"register_blocking"}).loops
    assert "in vector registers" not in again
    assert tg.build(outs, inputs, thresholds=every).loops == first
    assert tg.build(outs, inputs, thresholds=every, disabled_passes={"block_registers"}).loops == again
    assert len(list(tmp_path.glob("build-*"))) == 2


def _broken(name):
    """PASSES with pass ``name`` deliberately wrong: its stage's last nest stops one short of
    the end of its outermost loop (some elements miss their terms)."""
    def corrupt(p):
        def run(stage, machine):
            out = p.run(stage, machine)
            last = out.body[-1]
            return replace(out, body=out.body[:-1] + (replace(last, hi=last.hi - 1),))
        return replace(p, run=run)
    return tuple(corrupt(p) if p.name == name else p for p in PASSES)


@pytest.mark.parametrize("culprit", ["narrow_guarded_loops", "block_registers", "tile_stage"])
def test_bisection_names_a_broken_pass(monkeypatch, culprit):
    outs, inputs, feed = _dense(dtype="float64")
    want = tg.evaluate(outs, feed)

    def build(options):
        return tg.build(outs, inputs, options=options)

    def right(kern):
        (got,) = [kern(*[feed[t] for t in inputs])]  # one output: one array
        return np.allclose(got, want[0], rtol=1e-10, atol=1e-10)

    base = CompileOptions(disk_cache=False)  # the cache knows the code's files, not a patched pass
    assert bisect(build, right, base=base) is None
    monkeypatch.setattr(schedule, "PASSES", _broken(culprit))
    assert not right(build(base))
    assert right(build(base.replace(disabled_passes={culprit})))
    assert bisect(build, right, base=base) == culprit


def test_bisection_refuses_a_fault_outside_the_passes():
    outs, inputs, _ = _dense()
    with pytest.raises(tg.UserError, match="wrong with every optional schedule pass switched off"):
        bisect(lambda options: tg.build(outs, inputs, options=options), lambda kern: False,
               base=CompileOptions(disk_cache=False))


def test_verify_follows_the_options(monkeypatch):
    """``verify`` in force reaches the verifier run by simplify inside a build."""
    monkeypatch.delenv("TE_GRAD_VERIFY", raising=False)
    calls = []
    import simplify as simplify_package
    monkeypatch.setattr(simplify_package, "verify_if_enabled",
                        lambda tensors, stage: calls.append(verifying()))
    outs, inputs, _ = _dense(n=5)
    tg.build(outs, inputs, disk_cache=False)
    tg.build(outs, inputs, disk_cache=False, verify=True)
    assert calls == [False, True]
    with compile_options(verify=True):
        assert verifying()
    assert not verifying()


def test_packing_thresholds_are_an_option():
    outs, inputs, _ = _dense()
    assert "_packed" not in tg.build(outs, inputs, disk_cache=False).loops  # too small to repay a copy
    assert "_packed" in tg.build(outs, inputs, disk_cache=False, thresholds=packing.EVERY_COPY).loops
    with packing.using(packing.EVERY_COPY):
        assert packing.thresholds() is packing.EVERY_COPY
        assert "_packed" in tg.build(outs, inputs, disk_cache=False).loops
    assert packing.thresholds() == packing.DEFAULT
