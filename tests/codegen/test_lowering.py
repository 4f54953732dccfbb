"""Lowering decisions before emission (:func:`codegen.register_blocking.decide_blocks`).

A loop the schedule marks as a register block or an 8 x 8 transpose is kept only where
it has a vector form; otherwise it is turned back into its plain nest before emission,
so ``kernel.loops`` shows exactly the blocks the machine code has. The emitter lowers
every annotated loop it is given (and reports it in ``StageEmitter.emitted``), and
raises an InternalError on one without a vector form rather than falling back.
"""
import numpy as np
import pytest

import te_grad as tg
from codegen.llvm import ir
from codegen.llvm_emit import StageEmitter
from codegen.loopir import Carried, RegisterBlocked, Transposed, loops_of_kind, program_text, tensors_of
from codegen.register_blocking import decide_blocks
from codegen.machine import Machine
from codegen.schedule import schedule_steps, stages_for
from te_grad import formulations
from te_grad.errors import InternalError
from te_grad.suite import SUITE
from simplify import simplify

AVX2 = Machine(vector_bits=256, vector_registers=16, l1_bytes=32 * 1024, l2_bytes=1 << 20)
AVX512 = Machine(vector_bits=512, vector_registers=32, l1_bytes=48 * 1024, l2_bytes=2 << 20)
KINDS = (RegisterBlocked, Transposed, Carried)
#: the comment ``kernel.loops`` prints above each annotated loop, by kind
MARKERS = {RegisterBlocked: (": in vector registers across the loops below", ": lanes of a vector accumulator"),
           Transposed: ("// 8 x 8: rows of ",), Carried: ("// acc: a register carried along ",)}
RNG = np.random.default_rng(11)


def matmul(n, m, p, dtype, transposed=False):
    x = tg.placeholder((n, m), name="X", dtype=dtype)
    w = tg.placeholder((p, m) if transposed else (m, p), name="W", dtype=dtype)
    k = tg.reduce_axis(m, "k")
    if transposed:
        return tg.compute((n, p), lambda i, j: tg.sum(x[i, k] * w[j, k], axis=k), name="Y"), [x, w]
    return tg.compute((n, p), lambda i, j: tg.sum(x[i, k] * w[k, j], axis=k), name="Y"), [x, w]


def marked(stmts, kind=KINDS):
    return loops_of_kind(stmts, kind)


def markers(text: str, kind) -> int:
    return sum(text.count(m) for m in MARKERS[kind])


def undecided_stage(y, machine):
    """The schedule of ``y`` (already simplified) before the lowering decisions (the pass
    ``decide_blocks``, the last of the registry)."""
    steps = list(schedule_steps(y, y.op.body, machine))
    assert steps[-1][0] == "decide_blocks"
    return steps[-2][1]


def feed_of(inputs):
    return {x: (RNG.integers(-50, 50, x.shape).astype(x.dtype) if x.dtype.startswith("int")
                else RNG.standard_normal(x.shape).astype(x.dtype)) for x in inputs}


# -- blocks the emitter used to decline silently ------------------------------------------------
CASES = {
    # integer accumulators have no vector form in a register block
    "int32 matmul": (lambda: matmul(16, 16, 16, "int32"), AVX2, True, RegisterBlocked),
    # lanes along a reduce axis reassociate a sum: only with fast_math
    "X @ W.T without fast_math": (lambda: matmul(16, 32, 16, "float64", transposed=True), AVX2, False,
                                  RegisterBlocked),
    # (no float32 stage the transposer marks lacks a vector form any more: every float32 intrinsic
    # is inline vector code, and a boolean or data-dependent read is never marked for a transpose)
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_block_without_vector_form_is_a_plain_loop_in_the_loop_program(case):
    make, machine, fast, kind = CASES[case]
    y, inputs = make()
    (s,) = simplify([y])
    assert marked(undecided_stage(s, machine).body, kind), "the schedule marks the loop"
    kern = tg.build([y], inputs, machine=machine, fast_math=fast)
    assert markers(kern.loops, kind) == 0, kern.loops
    assert not any(marked(cs.stage.body, kind) for cs in kern.stages)
    feed = feed_of(inputs)
    (want,) = tg.evaluate([y], feed)
    got = kern(*[feed[x] for x in inputs])
    tol = 1e-6 if y.dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_fast_math_keeps_the_block_that_reassociates():
    y, inputs = matmul(16, 32, 16, "float64", transposed=True)
    kern = tg.build([y], inputs, machine=AVX2, fast_math=True)
    assert markers(kern.loops, RegisterBlocked) >= 1
    feed = feed_of(inputs)
    np.testing.assert_allclose(kern(*[feed[x] for x in inputs]), tg.evaluate([y], feed)[0], rtol=1e-12, atol=1e-12)


def test_the_emitter_raises_on_a_block_without_vector_form():
    y, inputs = matmul(16, 16, 16, "int32")
    (s,) = simplify([y])
    stage = undecided_stage(s, AVX2)
    index = {id(t): n for n, t in enumerate(tensors_of(stage))}
    with pytest.raises(InternalError, match="decide_blocks"):
        StageEmitter(ir.Module(), stage, "f", index).emit()
    decided = decide_blocks(stage)
    assert not marked(decided.body, RegisterBlocked)
    StageEmitter(ir.Module(), decided, "f", index).emit()


def test_the_decision_keeps_the_meaning():
    """The decided stage computes what the scheduled one did (the loop interpreter, both)."""
    from codegen.interpret import run
    y, inputs = matmul(6, 9, 16, "int32")
    (s,) = simplify([y])
    stage = undecided_stage(s, AVX2)
    decided = decide_blocks(stage)
    assert marked(stage.body, RegisterBlocked) and not marked(decided.body, RegisterBlocked)
    feed = feed_of(inputs)
    want = tg.evaluate([y], feed)[0]
    for st in (stage, decided):
        np.testing.assert_array_equal(run([st], feed)[id(s)], want)


# -- every block the loop program shows is emitted --------------------------------------------
def _workloads():
    for name, make in SUITE.items():
        for dt in ("float32", "float64"):
            yield f"suite/{name}/{dt}", make(dt)
    for op, forms in formulations.FORMULATIONS.items():
        for name, make in forms.items():
            yield f"form/{name}", make("float32", small=True)


def _emitted(stages, fast):
    """``[(stage, loops the emitter lowered as marked)]``."""
    index = {}
    for s in stages:
        for t in tensors_of(s):
            index.setdefault(id(t), len(index))
    out = []
    for n, s in enumerate(stages):
        em = StageEmitter(ir.Module(), s, f"stage{n}", index, fast)
        em.emit()
        out.append((s, em.emitted))
    return out


@pytest.mark.parametrize("machine", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_every_block_in_the_loop_program_is_emitted(machine):
    seen = {k: 0 for k in KINDS}
    for name, w in _workloads():
        grads = tg.gradient(w.output, w.inputs)
        stages = stages_for(simplify([w.output] + list(grads)), machine)
        text = program_text(stages)
        emitted = _emitted(stages, True)
        for kind in KINDS:
            shown = [lp for s in stages for lp in marked(s.body, kind)]
            lowered = [lp for _, done in emitted for lp in done if isinstance(lp.kind, kind)]
            assert markers(text, kind) == len(shown) == len(lowered), (name, kind.__name__)
            assert {id(lp) for lp in shown} == {id(lp) for lp in lowered}, (name, kind.__name__)
            seen[kind] += len(shown)
    assert all(seen.values()), seen  # every kind occurs somewhere in the corpus


def test_the_kernel_loop_program_matches_its_emitted_blocks_without_fast_math():
    w = SUITE["max_pool2x2"]("float32")
    inputs = w.inputs + list(w.data)
    kern = tg.build([w.output], inputs, machine=AVX512, fast_math=False)
    stages = [cs.stage for cs in kern.stages]
    emitted = [lp for _, done in _emitted(stages, False) for lp in done]
    for kind in KINDS:
        assert markers(kern.loops, kind) == sum(isinstance(lp.kind, kind) for lp in emitted), kind.__name__
