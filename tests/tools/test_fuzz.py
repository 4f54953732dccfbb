"""Random programs: every stage of te_grad against the others (see te_grad/tools/fuzz).

A fixed budget runs here, through hypothesis (which shrinks a failing program
choice by choice); ``python -m te_grad fuzz --programs N`` runs any number.
"""
import io
import os
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings

from te_grad.tools import fuzz
from te_grad.tools.fuzz import Program, check, from_choices, from_seed, shrink


# The program being checked is written to /tmp/hyp_current.py first: a program whose checks
# take minutes can then be read back while the test runs (as tests/tools/fuzz_shared_second_order.py
# once did).
@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fuzz.programs())
def test_random_programs_agree_in_every_stage(program):
    open("/tmp/hyp_current.py", "w").write(program.source)
    outcome = check(program, seed=0)
    assert not outcome.failed, f"{outcome.kind}: {outcome.detail}\n\n{program.source}"


@pytest.mark.parametrize("block", range(6))
def test_seeded_programs_agree_in_every_stage(block):
    """Uniformly random choices give larger programs than hypothesis's first draws: 150 of them."""
    for index in range(25 * block, 25 * block + 25):
        program = from_seed(900_000 + index)
        outcome = check(program, seed=index)
        assert not outcome.failed, f"{outcome.kind}: {outcome.detail}\n\n{program.source}"


def test_programs_are_reproducible_and_valid():
    a, b = from_seed(123), from_seed(123)
    assert a.source == b.source and a.choices == b.choices
    assert from_choices(a.choices).source == a.source
    assert from_choices([]).source  # the simplest program: every choice 0
    ns = from_seed(5).build("float64")
    assert ns["OUT"] is ns["STAGES"][-1] and all(x.dtype == "float64" for x in ns["INPUTS"])


def test_the_checks_catch_a_wrong_gradient(monkeypatch):
    """A derivative rule broken on purpose must be reported as a disagreement with finite
    differences (the raw witness), not pass."""
    from te_grad.autodiff.rules import INTRINSIC_RULES
    monkeypatch.setitem(INTRINSIC_RULES, "sin", lambda x, y: 2.0 * x)
    source = ("C = lambda value: tg.const(value, DT)\nX0 = tg.placeholder((3,), dtype=DT, name='X0')\n"
              "S0 = tg.compute((3,), lambda i0: tg.sin(X0[i0]), name='S0')\n"
              "OUT = S0\nSTAGES = [S0]\nINPUTS = [X0]\nIDS = {}\n")
    outcome = check(Program(source), seed=0)
    assert outcome.kind == "mismatch-raw-fd", outcome


def test_shrinking_makes_a_failing_program_smaller():
    big = next(p for p in (from_seed(s) for s in range(200)) if p.source.count("tg.compute") >= 3
               and "tg.sum" in p.source)

    def fails(p):  # a stand-in failure: "the program has a sum"
        return "tg.sum" in p.source
    small = shrink(big, fails, budget_s=30)
    assert fails(small) and len(small.source) < len(big.source)
    assert small.source.count("tg.compute") <= big.source.count("tg.compute")


def test_run_prints_counts_and_the_command_line_works():
    out = io.StringIO()
    counts = fuzz.run(4, seed=11, out=out, progress_every=0)
    assert sum(counts.values()) == 4 and "4 programs (seed 11)" in out.getvalue()
    proc = subprocess.run([sys.executable, "-m", "te_grad", "fuzz", "--programs", "3", "--seed", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 programs (seed 2)" in proc.stdout and "ok" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "te_grad.tools.fuzz", "--programs", "2", "--seed", "2", "--no-compile"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 programs (seed 2)" in proc.stdout


#: programs the fuzzer found failing, kept as regression cases (each was fixed at its root)
FOUND = {
    # a register block jammed an output axis that an inner loop's bounds use
    "jam_with_dependent_bounds": """
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((4, 3), dtype=DT, name='X0')
S0 = tg.compute((4, 4, 1), lambda i0, i1, i2: tg.cast(DT, X0[(i1 // 2), (i1 // 3)]), name='S0')
OUT = S0
STAGES = [S0]
INPUTS = [X0]
IDS = {}
""",
    # isl's AST put the integer 1 where a condition goes
    "integer_in_an_ast_condition": """
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((1, 2), dtype=DT, name='X0')
S0 = tg.compute((3, 4, 3), lambda i0, i1, i2: tg.cast(DT, (X0[(i0) % 1, ((2 * i0 + 0)) % 2] + X0[(i0) % 1, ((i0 + -2)) % 2])), name='S0')
k2 = tg.reduce_axis((0, 3), name='k2')
S2 = tg.compute((3, 1, 1), lambda i0, i1, i2: tg.cast(DT, tg.sum((C(2.0) * S0[(i1 + 0), (((3 * i0 + 1 * k2 + 2) // 2)) % 4, ((2 * k2 + 1 * i0 + 1) // 4)]), axis=[k2])), name='S2')
OUT = S2
STAGES = [S0, S2]
INPUTS = [X0]
IDS = {}
""",
    # a max's winner recomputed with a fused multiply-add where the stored maximum had none
    "max_winner_recomputed_bitwise": """
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((), dtype=DT, name='X0')
X1 = tg.placeholder((1, 3, 1), dtype=DT, name='X1')
S0 = tg.compute((2, 1), lambda i0, i1: tg.cast(DT, tg.tanh((-tg.if_then_else(C(2.0) > 0.0, C(2.0) * tg.log(C(2.0)), 0.0)))), name='S0')
k0 = tg.reduce_axis((0, 1), name='k0')
S1 = tg.compute((2,), lambda i0: tg.cast(DT, tg.max(((tg.if_then_else(i0 < 0, X1[(i0) % 1, i0, ((i0 + -2)) % 1], X1[(i0) % 1, i0, ((0 - i0)) % 1]) + (C(1.5) * S0[0, (i0) % 1])) + X0[()]), axis=[k0])), name='S1')
OUT = S1
STAGES = [S0, S1]
INPUTS = [X0, X1]
IDS = {}
""",
    # a min over a product that the gradient recomputes in another stage, one ulp away
    # from the forward's (the winners compared bitwise found none)
    "min_of_a_product_recomputed": """
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((4, 4), dtype=DT, name='X0')
X1 = tg.placeholder((), dtype=DT, name='X1')
I0 = tg.placeholder((1,), dtype='int64', name='I0')
k0 = tg.reduce_axis((0, 2), name='k0')
k1 = tg.reduce_axis((0, 1), name='k1')
k2 = tg.reduce_axis((1, 4), name='k2')
S0 = tg.compute((), lambda : tg.cast(DT, tg.min(tg.prod(tg.tanh(X0[k2, I0[0]]) * 0.5 + 1.0, axis=[k2], where=(k0 % 2) == 0), axis=[k0, k1])), name='S0')
OUT = S0
STAGES = [S0]
INPUTS = [X0, X1]
IDS = {I0: 1}
""",
    # a reduction nested in one whose bounds vary (where=k0 <= k1): lifted over their hull
    "nested_in_varying_bounds": """
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((1,), dtype=DT, name='X0')
k0 = tg.reduce_axis((0, 2), name='k0')
k1 = tg.reduce_axis((0, 2), name='k1')
k2 = tg.reduce_axis((0, 0), name='k2')
S0 = tg.compute((1, 1, 1), lambda i0, i1, i2: tg.cast(DT, tg.sum(tg.sum((C(0.5) * X0[(k1) % 1]), axis=[k2]), axis=[k0, k1], where=k0 <= k1)), name='S0')
OUT = S0
STAGES = [S0]
INPUTS = [X0]
IDS = {}
""",
    # a reduction under a guard, lifted into a tensor of its own: the tensor keeps the guard
    # as a filter, or it reads S0[..., -1] (a data-dependent read) where the guard is false
    "guarded_reduction_lifted": """
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((), dtype=DT, name='X0')
X1 = tg.placeholder((1,), dtype=DT, name='X1')
I0 = tg.placeholder((1,), dtype='int64', name='I0')
S0 = tg.compute((4, 1, 3), lambda i0, i1, i2: tg.cast(DT, tg.if_then_else(((X1[((i0 + -2)) % 1] + X0[()]) + tg.exp(tg.tanh(X1[(i0) % 1]))) > (X0[()] / (X1[i1] * X1[i1] + 0.5)), tg.if_then_else((X0[()] + X0[()]) > 0.0, tg.sqrt((X0[()] + X0[()])), 3.0 * (X0[()] + X0[()])), X1[(i2) % 1])), name='S0')
S1 = tg.compute((4, 4, 3), lambda i0, i1, i2: tg.cast(DT, X0[()]), name='S1')
S2 = tg.compute((3, 1, 3), lambda i0, i1, i2: tg.cast(DT, (tg.if_then_else(X1[(i0) % 1] > S0[I0[((i2 + 1)) % 1], (i0 // 4), (2 - i2)], tg.if_then_else(tg.all(i2 + 0 >= 0, i2 + 0 < 4), S0[i2 + 0, ((2 - i0)) % 1, (i0 // 2)], C(0.5)), (X0[()] + X0[()])) + X0[()])), name='S2')
OUT = S2
STAGES = [S0, S1, S2]
INPUTS = [X0, X1]
IDS = {I0: 1}
""",
    # a min over a single term, folded by the simplifier into a plain tensor: the kernel
    # stored it with a reciprocal multiply while the winner test recomputed the division
    # a product nested in one over k1 (where=i0 <= k1: varying bounds) that reads S2 at
    # k1 - 1 under its own guard: lifted over k1's hull, it keeps k1's bounds as its filter
    "nested_in_varying_bounds_guarded": """
# a random te_grad program (te_grad.tools.fuzz); DT is the float dtype
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((1, 1), dtype=DT, name='X0')
S0 = tg.compute((), lambda : tg.cast(DT, (X0[0, 0] / (X0[0, 0] * X0[0, 0] + 0.5))), name='S0')
S1 = tg.compute((4, 4, 2), lambda i0, i1, i2: tg.cast(DT, tg.atan2(tg.if_then_else(((X0[((i1 + -2)) % 1, (i0) % 1] + S0[()]) + (X0[((i1 + -2)) % 1, ((i0 + -2)) % 1] / (X0[(((2 * i0 + 1 * i1 + 0) % 2)) % 1, (i1) % 1] * X0[(((2 * i0 + 1 * i1 + 0) % 2)) % 1, (i1) % 1] + 0.5))) > X0[((2 * i0 + 1)) % 1, 0], tg.exp(tg.tanh(tg.if_then_else((i2 % 2) == 1, X0[(i0) % 1, (((2 * i0 + 2 * i0 + 1) % 3)) % 1], S0[()]))), (C(0.25) * S0[()])), X0[((0 - i0)) % 1, ((i1 + -1)) % 1] * X0[((0 - i0)) % 1, ((i1 + -1)) % 1] + 0.3)), name='S1')
k0 = tg.reduce_axis((1, 2), name='k0')
S2 = tg.compute((2, 1, 2), lambda i0, i1, i2: tg.cast(DT, tg.exp(tg.tanh(tg.prod(tg.tanh(X0[(i0) % 1, (k0) % 1]) * 0.5 + 1.0, axis=[k0], where=tg.if_then_else(tg.all(i1 + -1 >= 0, i1 + -1 < 1), X0[i1 + -1, (k0 // 4)], C(-0.75)) > S1[(i1 // 2), i1, k0])))), name='S2')
k1 = tg.reduce_axis((0, 2), name='k1')
k2 = tg.reduce_axis((1, 3), name='k2')
k3 = tg.reduce_axis((0, 0), name='k3')
S3 = tg.compute((2,), lambda i0: tg.cast(DT, tg.prod(tg.tanh(tg.if_then_else(i0 <= i0, tg.pow(tg.if_then_else((i0 % 2) == 0, S2[0, ((2 * k1 + 2)) % 1, ((i0 + -2)) % 2], S0[()]) * tg.if_then_else((i0 % 2) == 0, S2[0, ((2 * k1 + 2)) % 1, ((i0 + -2)) % 2], S0[()]) + 0.5, 2.0), tg.if_then_else(tg.pow(S0[()] * S0[()] + 0.5, 1.5) > tg.prod(tg.tanh(tg.if_then_else(tg.all(k1 + -1 >= 0, k1 + -1 < 1), S2[((0 - k1)) % 2, k1 + -1, ((k1 + -2)) % 2], C(-0.75))) * 0.5 + 1.0, axis=[k2, k3]), tg.sqrt(X0[((2 - k1)) % 1, ((i0 + -2)) % 1] * X0[((2 - k1)) % 1, ((i0 + -2)) % 1] + 0.25), tg.exp(tg.tanh(X0[((k1 + -2)) % 1, (k1) % 1]))))) * 0.5 + 1.0, axis=[k1], where=i0 <= k1)), name='S3')
OUT = S3
STAGES = [S0, S1, S2, S3]
INPUTS = [X0]
IDS = {}
""",
    "single_term_min_compared": """
# a random te_grad program (te_grad.tools.fuzz); DT is the float dtype
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((3, 3, 1), dtype=DT, name='X0')
k0 = tg.reduce_axis((0, 1), name='k0')
S0 = tg.compute((2,), lambda i0: tg.cast(DT, (C(0.5) * tg.minimum(tg.min((X0[2, ((i0 + -2)) % 3, (i0) % 1] / (X0[k0, k0, k0] * X0[k0, k0, k0] + 0.5)), axis=[k0], where=i0 <= i0), C(0.5)))), name='S0')
OUT = S0
STAGES = [S0]
INPUTS = [X0]
IDS = {}
""",
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_programs_the_fuzzer_found(name):
    for seed in (0, 1, 1409, 2059, 9786):  # the inputs that showed a fused multiply-add, a last-bit product,
        # a reciprocal multiply
        outcome = check(Program(FOUND[name]), seed=seed)
        assert not outcome.failed, f"{outcome.kind}: {outcome.detail}"


def test_the_generator_draws_every_construct():
    """A fuzzer that never generates a construct cannot find its bugs: among the first
    seeds there are second-order programs, gather stages whose gradients are scatters,
    argmax / argmin winners used as indices, and invalid programs (reads out of bounds under a condition on data)."""
    sources = [from_seed(s).source for s in range(300)]
    second = [src for src in sources if "SECOND = True" in src]
    assert len(second) > 60
    assert sum("I1 = tg.placeholder" in src for src in sources) > 30  # gather stages of their own
    assert sum("tg.argmax(" in src or "tg.argmin(" in src for src in sources) > 30  # winners as indices
    # a row sum dividing by zero off its guard, tested against itself under that guard
    assert sum("r = tg.sum(XS[" in src and "tg.if_then_else(r > e" in src for src in sources) >= 2
    # blocks of one axis read apart and a concat: selects on ranges of an axis, dividing it by 8
    assert sum("XK = tg.placeholder" in src for src in sources) >= 5
    invalid = [src for src in sources if "INVALID = " in src]
    assert len(invalid) > 15 and not any("SECOND = True" in src for src in invalid)
    for src in invalid[:5]:
        ns = Program(src).build("float64")
        assert ns["INVALID"] is ns["OUT"]


def test_the_run_counts_the_constructs_it_exercised():
    out = io.StringIO()
    fuzz.run(40, seed=7, out=out, progress_every=0, shrink_failures=False)
    text = out.getvalue()
    assert "programs with second order:" in text and "programs with out= aliasing refused:" in text
    assert "programs with a read out of bounds under a data condition:" in text


def test_the_second_order_check_catches_a_missing_scatter_rule(monkeypatch):
    """Second order through a scatter, with the scatter's reverse rule dropped on purpose
    (its inputs get nothing, as before scatters had a rule), is reported against finite
    differences of the first order, not passed."""
    from te_grad import autodiff
    from te_grad.ir import ScatterOp
    source = ("C = lambda value: tg.const(value, DT)\nX0 = tg.placeholder((6,), dtype=DT, name='X0')\n"
              "I0 = tg.placeholder((4,), dtype='int64', name='I0')\n"
              "S0 = tg.compute((4,), lambda i0: tg.tanh(X0[I0[i0]]), name='S0')\n"
              "OUT = S0\nSTAGES = [S0]\nINPUTS = [X0]\nIDS = {I0: 6}\nSECOND = True\n")
    outcome = check(Program(source), seed=0)
    assert outcome.kind == "ok" and "second order through a scatter" in outcome.notes, outcome
    monkeypatch.setitem(autodiff.VJP_RULES, ScatterOp, lambda t, adj, box: [])
    outcome = check(Program(source), seed=0)
    assert outcome.kind == "mismatch-second-order-fd", outcome


def test_the_generator_draws_coo_stages():
    """Reductions whose where pins an output variable by data (``I[e] == i0 + c``) are drawn,
    and they pass every check (compiled, simplified, raw, finite differences)."""
    sources = [(s, from_seed(s).source) for s in range(300)]
    coo = [(s, src) for s, src in sources if "] == i0" in src or "i0 == I" in src or "== I" in src]
    assert len(coo) > 30
    assert any(" + 1 == " in src or "i0 + 1" in src for _, src in coo)
    for seed, src in coo[:6]:
        outcome = check(Program(src), seed=seed)
        assert not outcome.failed, f"{outcome.kind}: {outcome.detail}\n{src}"
        assert "a where pinning an output index by data (a COO scatter)" in outcome.notes


def test_the_generator_draws_products_copied_in_panels():
    """Linear layers over 32 or 48 columns (``W[k, i1]`` and ``W[i1, k]``) and products reading
    panels written by hand, ``P[i1 // 8, q, i1 % 8]``, over columns that are not all whole
    panels: the kernel built with every copy reads the weights from copies in panels, and the
    programs pass every check."""
    sources = [(s, from_seed(s).source) for s in range(600)]
    panel = [(s, src) for s, src in sources if "// 8, Q" in src]
    assert len(panel) >= 5
    assert any("[i1, K" in src for _, src in panel) and any("[K" in src and ", i1]" in src for _, src in panel)
    hand = [int(re.search(r"compute\(\(\d+, (\d+)\), lambda i0, i1: tg\.sum\(L", src).group(1)) for _, src in panel]
    assert any(n % 8 for n in hand) and any(n % 8 == 0 for n in hand)  # rows of panels ending inside one, and whole
    for seed, src in panel[:3]:
        outcome = check(Program(src), seed=seed)
        assert not outcome.failed, f"{outcome.kind}: {outcome.detail}\n{src}"
        assert "an operand copied in panels (codegen.packing)" in outcome.notes, outcome
        assert "an identity copy read through (simplify.inline)" in outcome.notes, outcome


def test_the_generator_draws_sized_stages():
    """Programs whose last stage has a shape in a size variable (a window, a stride, a shift,
    a reduction over (0, n), a guard on the size), checked at 2 or 3 sizes, the smallest
    allowed first."""
    sources = [from_seed(s).source for s in range(300)]
    sized = [src for src in sources if "SIZE = n = tg.var" in src]
    assert len(sized) > 30 and not any("INVALID = " in src or "SECOND = True" in src for src in sized)
    for form in ("XN[i0 + kN]", "XN[2 * i0 + kN]", "XN[i0 + 1, i1]", "reduce_axis((0, n)", "i0 + kN < n"):
        assert any(form in src for src in sized), form
    ns = Program(sized[0]).build("float64")
    assert ns["SIZES"][0] == ns["SIZE"].lo and 2 <= len(ns["SIZES"]) <= 3
    outcome = check(Program(sized[0]), seed=0)
    assert outcome.kind in ("ok", "fd-unstable") and "a size variable" in outcome.notes, outcome


def test_the_generator_draws_products_over_a_size_variable():
    """The sized stage's reduction over ``(0, n)`` is sometimes a product: its gradient (the
    product of the others over a run-time extent) checked at every size, evaluated and compiled."""
    sources = [(s, from_seed(s).source) for s in range(600)]
    products = [(s, src) for s, src in sources if "SIZED_PRODUCT = True" in src]
    assert len(products) >= 2
    assert all("tg.prod(tg.tanh(tg.sin(XN" in src for _, src in products)  # the flag says what is there
    assert not any("tg.prod(tg.tanh(tg.sin(XN" in src for _, src in sources if "SIZED_PRODUCT = False" in src)
    seed, src = products[0]
    outcome = check(Program(src), seed=seed)
    assert outcome.kind in ("ok", "fd-unstable") and "a product over a run-time extent" in outcome.notes, outcome


def test_sized_weight_gradients_are_cut_for_the_cache_in_the_fuzzer():
    """The sized stage written as a weight gradient (a sum over ``(0, n)`` and a constant
    axis) is drawn, and the symbolic kernel the fuzzer builds for tiny caches takes its batch
    loop one value at a time (:mod:`codegen.cache_tiling`): the fuzzer exercises that cut."""
    from te_grad.tools.fuzz.check import _built_with_every_copy
    sources = [(s, from_seed(s).source) for s in range(300)]
    weight = [(s, src) for s, src in sources if "kM = tg.reduce_axis" in src]
    assert len(weight) >= 3
    seed, src = weight[0]
    ns = Program(src).build("float64")
    assert "for (kNt = 0; kNt < n; ++kNt)" in _built_with_every_copy([ns["OUT"]], ns["INPUTS"]).loops
    outcome = check(Program(src), seed=seed)
    assert outcome.kind in ("ok", "fd-unstable") and "a size variable" in outcome.notes, outcome


def test_the_sized_check_catches_a_wrong_simplification(monkeypatch):
    """A simplified gradient that is wrong at one size only (a loop bound off by one for the
    smallest size) is reported, not passed: every size is checked."""
    import simplify
    from te_grad import dsl
    from te_grad.ir import ComputeOp, Tensor
    from te_grad.sizes import size_vars_in
    source = ("C = lambda value: tg.const(value, DT)\nX0 = tg.placeholder((2,), dtype=DT, name='X0')\n"
              "SIZE = n = tg.var('n', min=1)\nkN = tg.reduce_axis((0, 2), name='kN')\n"
              "XN = tg.placeholder((n + 1,), dtype=DT, name='XN')\n"
              "S0 = tg.compute((n,), lambda i0: tg.cast(DT, tg.sum(tg.sin(XN[i0 + kN]) * tg.tanh(X0[1]), "
              "axis=kN)), name='S0')\nSIZES = [1, 3]\n"
              "OUT = S0\nSTAGES = [S0]\nINPUTS = [X0, XN]\nIDS = {}\n")
    assert check(Program(source), seed=0, compile_=False).kind == "ok"
    original = simplify.simplify_graph

    def broken(tensors, keep=frozenset(), fallbacks=None):
        new = original(tensors, keep, fallbacks)
        for k, t in list(new.items()):
            if t.name == "dXN":  # zero where n == 1
                (n,) = size_vars_in(t.shape[0])
                body = dsl.if_then_else(n > 1, t.op.body, dsl.const(0.0, t.dtype))
                new[k] = Tensor(t.name, t.shape, t.dtype, ComputeOp(t.op.axes, body))
        return new
    monkeypatch.setattr(simplify, "simplify_graph", broken)  # what tg.differentiate calls
    outcome = check(Program(source), seed=0, compile_=False)
    assert outcome.kind == "mismatch-simplified-raw" and "n=1" in outcome.detail, outcome


def test_a_second_order_gradient_with_heavy_sharing_builds():
    """A drawn program whose second-order gradient is a DAG of about 5,400 nodes and a tree of
    480,000 (tests/tools/fuzz_shared_second_order.py): every stage walks the DAG, not the tree,
    so it is checked in seconds and passes (it once took minutes in the structural-zeros demand
    walk and in LLVM, with a 59 MB stage function)."""
    path = os.path.join(os.path.dirname(__file__), "fuzz_shared_second_order.py")
    outcome = check(Program(open(path).read()), seed=0)
    assert not outcome.failed, f"{outcome.kind}: {outcome.detail}"
    assert "second order" in outcome.notes


def test_the_generator_draws_mask_stages():
    """Square matrices masked by a causal or band relation of their axes (with -inf before a
    softmax, or with 0, maybe through exp) times a matrix summed over the masked axis are
    drawn, some with the second order, and they pass every check: the zeros carried across
    tensors (simplify/zeros.py), masked tensors written only on their region (simplify/unread.py,
    checked with poisoned intermediates) and the triangles cut into blocks (codegen/triangles.py)."""
    sources = [(s, from_seed(s).source) for s in range(600)]
    masks = [(s, src) for s, src in sources if "XM = tg.placeholder" in src]
    assert len(masks) > 15
    assert any("-float('inf')" in src for _, src in masks) and any("tg.exp(tg.if_then_else" in src for _, src in masks)
    assert any("SECOND = True" in src for _, src in masks)
    big = [(s, src) for s, src in masks if re.search(r"XM = tg.placeholder\(\(\d\d, ", src)]
    assert big  # 33 rows or more: the triangles are cut into blocks
    regions = 0
    for seed, src in masks[:5] + big[:2]:
        outcome = check(Program(src), seed=seed)
        assert not outcome.failed, f"{outcome.kind}: {outcome.detail}\n{src}"
        assert "a causal or band mask (zeros carried across tensors)" in outcome.notes
        regions += "a tensor written only where it is read (simplify.unread)" in outcome.notes
    assert regions >= 2  # masked tensors written on their region only, checked with poisoned buffers
