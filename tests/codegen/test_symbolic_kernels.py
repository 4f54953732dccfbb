"""Kernels on graphs whose shapes use size variables (tg.var): one native kernel for every
value of the sizes, bound from the arguments' shapes at each call; values against the
oracle (which specializes the graph at the bound sizes)."""
import numpy as np
import pytest

import codegen
import te_grad as tg
from te_grad.errors import UserError

RNG = np.random.default_rng(7)


def _chain():
    n = tg.var("n", min=2)
    X = tg.placeholder((n, 8), name="X")
    W = tg.placeholder((8, 4), name="W")
    k = tg.reduce_axis(8, "k")
    Y = tg.compute((n, 4), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")
    Z = tg.compute((n - 1,), lambda i: tg.tanh(Y[i, 0] + Y[i + 1, 1]), name="Z")
    r = tg.reduce_axis((0, n - 1), "r")
    L = tg.compute((), lambda: tg.sum(Z[r] * Z[r], axis=r), name="L")
    return n, X, W, Y, Z, L


def _rand(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.fixture
def count_compiles(monkeypatch):
    """The LLVM modules compiled so far (by the compile worker or in this process; a module
    found in the in-process or disk cache is not compiled)."""
    from codegen import jit
    from codegen.team import team
    from codegen.kernel import default_threads
    team(default_threads())  # the thread team's own module, compiled once per process
    jit.clear_cache()  # modules and parts of earlier tests
    calls = []
    remote, here, parts = jit._remote, jit._compile_here, jit._compile_parts

    def counting_remote(text, key, functions):
        got = remote(text, key, functions)
        if got is not None:
            calls.append(key)
        return got

    def counting_here(text, key, functions):
        calls.append(key)
        return here(text, key, functions)
    def counting_parts(texts):  # a module split per stage: its parts not found in a cache
        calls.append(texts)
        return parts(texts)
    monkeypatch.setattr(jit, "_remote", counting_remote)
    monkeypatch.setattr(jit, "_compile_here", counting_here)
    monkeypatch.setattr(jit, "_compile_parts", counting_parts)
    return calls


def test_one_kernel_serves_every_size(count_compiles):
    n, X, W, Y, Z, L = _chain()
    with codegen.compile_options(disk_cache=False):
        kern = tg.build([Y, Z, L], [X, W])
        assert kern.size_vars == (n,)
        w = _rand(8, 4)
        for size in (2, 3, 17, 64):  # 2: the smallest n allowed
            x = _rand(size, 8)
            got = kern(x, w)
            want = tg.evaluate([Y, Z, L], {X: x, W: w})
            assert [g.shape for g in got] == [(size, 4), (size - 1,), ()]
            for g, e in zip(got, want):
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert len(count_compiles) == 1


def test_a_symbolic_module_reads_its_sizes_at_run_time():
    n, X, W, Y, Z, L = _chain()
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(Z, [X, W])
    assert "for (i = 0; i < n - 1; ++i)" in kern.loops.replace("(n - 1)", "n - 1")
    x, w = _rand(5, 8), _rand(8, 4)
    np.testing.assert_allclose(kern(x, w), tg.evaluate([Z], {X: x, W: w})[0], rtol=1e-5, atol=1e-5)


def test_inconsistent_arguments_name_the_variable_and_both_arrays():
    n = tg.var("n", min=1)
    A = tg.placeholder((n, 3), name="A")
    B = tg.placeholder((n,), name="B")
    C = tg.compute((n, 3), lambda i, j: A[i, j] * B[i], name="C")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(C, [A, B])
    with pytest.raises(UserError, match=r"argument B has extent 5.*n = 4 \(from argument A"):
        kern(_rand(4, 3), _rand(5))
    with pytest.raises(UserError, match=r"n = 0.*must be >= 1"):
        kern(_rand(0, 3), _rand(0))
    with pytest.raises(UserError, match=r"argument out=C has extent 5.*n = 4"):
        kern(_rand(4, 3), _rand(4), out=np.empty((5, 3), np.float32))
    a, b = _rand(4, 3), _rand(4)
    out = np.empty((4, 3), np.float32)
    kern(a, b, out=out)
    np.testing.assert_allclose(out, a * b[:, None], rtol=1e-6)
    res = np.empty((4, 3), np.float32)
    kern.run([a, b], [res])
    np.testing.assert_allclose(res, a * b[:, None], rtol=1e-6)
    with pytest.raises(UserError, match="argument B"):
        kern.run([a, _rand(3)], [res])
    assert [p["tensor"] for p in kern.profile([a, b], [res], repeat=1)] == ["C"]
    res2 = np.empty((4, 3), np.float32)
    kern.run_pointers([a.ctypes.data, b.ctypes.data], [res2.ctypes.data], sizes={"n": 4})
    np.testing.assert_allclose(res2, res)
    with pytest.raises(UserError, match="sizes="):
        kern.run_pointers([a.ctypes.data, b.ctypes.data], [res2.ctypes.data])


def test_reduce_bounds_strides_and_intermediates_at_run_time():
    n, m = tg.var("n", min=1), tg.var("m", min=3)
    X = tg.placeholder((n, m), name="X")
    r = tg.reduce_axis((0, m), "r")
    S = tg.compute((n,), lambda i: tg.sum(X[i, r], axis=r), name="S")
    E = tg.compute((n, m), lambda i, j: tg.exp(X[i, j] - S[i]), name="E")
    q = tg.reduce_axis((0, m - 2), "q")
    P = tg.compute((n, m - 2), lambda i, j: tg.sum(E[i, q] * X[i, j + 2], axis=q), name="P")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build([S, P], [X])
    for shape in ((1, 3), (4, 7), (9, 33)):
        x = _rand(*shape)
        got = kern(x)
        want = tg.evaluate([S, P], {X: x})
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def test_a_data_index_out_of_range_names_the_bound_extent():
    n = tg.var("n", min=1)
    T = tg.placeholder((n, 2), name="T")
    ids = tg.placeholder((3,), dtype="int64", name="ids")
    G = tg.compute((3, 2), lambda i, j: T[ids[i], j], name="G")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(G, [T, ids])
    t = _rand(5, 2)
    np.testing.assert_array_equal(kern(t, np.array([4, 0, 2])), t[[4, 0, 2]])
    with pytest.raises(UserError, match=r"index 5 is out of range \[0, 5\)"):
        kern(t, np.array([5, 0, 2]))


def test_the_disk_cache_keeps_one_build_for_every_size(count_compiles, tmp_path):
    from codegen import jit
    with codegen.compile_options(disk_cache=True, cache_dir=str(tmp_path)):
        _, X0, W0, _, _, L0 = _chain()
        tg.build(L0, [X0, W0])
        n, X, W, Y, Z, L = _chain()  # the same graph, new objects: found on disk
        jit.clear_cache()
        again = tg.build(L, [X, W])
        assert len(count_compiles) == 1  # the second build compiled nothing
        assert again.size_vars == (n,)
        w = _rand(8, 4)
        for size in (2, 5, 30):
            x = _rand(size, 8)
            np.testing.assert_allclose(again(x, w), tg.evaluate([L], {X: x, W: w})[0], rtol=1e-4)
        with pytest.raises(UserError, match="n = 1.*>= 2"):
            again(_rand(1, 8), w)
        # a variable of the same name with another range makes another graph
        m = tg.var("n", min=3)
        X3, W3 = tg.placeholder((m, 8), name="X"), tg.placeholder((8, 4), name="W")
        k = tg.reduce_axis(8, "k")
        Y3 = tg.compute((m, 4), lambda i, j: tg.sum(X3[i, k] * W3[k, j], axis=k), name="Y")
        Z3 = tg.compute((m - 1,), lambda i: tg.tanh(Y3[i, 0] + Y3[i + 1, 1]), name="Z")
        r = tg.reduce_axis((0, m - 1), "r")
        L3 = tg.compute((), lambda: tg.sum(Z3[r] * Z3[r], axis=r), name="L")
        third = tg.build(L3, [X3, W3])
        with pytest.raises(UserError, match="n = 2.*>= 3"):
            third(_rand(2, 8), w)
    assert len(count_compiles) == 1  # the same module: the range is checked by the call


def _export_and_run(kernel, sizes, arrays, out_shapes, tmp_path, name="sym"):
    """Export ``kernel``, call it from a C program with ``sizes`` (int64 values, in the order
    of kernel.size_vars) and ``arrays``; return (rc, info, outputs)."""
    import shutil
    import subprocess
    from codegen.export import C_TYPES
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    d = tmp_path / "c"
    d.mkdir(exist_ok=True)
    files = kernel.export(str(d / name))
    lines = ["#include <stdio.h>", "#include <stdlib.h>", f'#include "{name}.h"',
             "static void *load(const char *p, size_t n) { FILE *f = fopen(p, \"rb\"); void *m = malloc(n ? n : 1);",
             "  if (!f || fread(m, 1, n, f) != n) { exit(3); }",
             "  fclose(f); return m; }",
             "int main(void) {"]
    args = [f"(int64_t){v}" for v in sizes]
    for k, (t, a) in enumerate(zip(kernel.inputs, arrays)):
        lines.append(f"  {C_TYPES[t.dtype]} *in{k} = load(\"in{k}.bin\", {a.nbytes});")
        a.tofile(d / f"in{k}.bin")
        args.append(f"in{k}")
    for k, (t, shape) in enumerate(zip(kernel.outputs, out_shapes)):
        count = max(1, int(np.prod(shape)))
        lines.append(f"  {C_TYPES[t.dtype]} *out{k} = calloc({count}, sizeof({C_TYPES[t.dtype]}));")
        args.append(f"out{k}")
    lines += ["  int64_t info[4] = {0, 0, 0, 0};", f"  int rc = {name}_ex({', '.join(args)}, info);",
              "  printf(\"%d %lld %lld %lld %lld\\n\", rc, (long long)info[0], (long long)info[1], "
              "(long long)info[2], (long long)info[3]);"]
    for k, (t, shape) in enumerate(zip(kernel.outputs, out_shapes)):
        lines.append(f"  {{ FILE *f = fopen(\"out{k}.bin\", \"wb\"); fwrite(out{k}, sizeof({C_TYPES[t.dtype]}), "
                     f"{int(np.prod(shape))}, f); fclose(f); }}")
    lines += ["  return 0;", "}"]
    (d / "main.c").write_text("\n".join(lines) + "\n")
    done = subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", "-O1", "-I", str(d), "-o", str(d / "prog"),
                           str(d / "main.c"), files["object"], "-lm"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([str(d / "prog")], capture_output=True, text=True, cwd=d, timeout=120)
    assert done.returncode == 0, done.stderr
    rc, *info = [int(v) for v in done.stdout.split()]
    outs = [np.fromfile(d / f"out{k}.bin", dtype=t.dtype).reshape(shape)
            for k, (t, shape) in enumerate(zip(kernel.outputs, out_shapes))]
    return rc, info, outs


def test_export_takes_the_sizes_as_int64_arguments_checked_at_entry(tmp_path):
    n, X, W, Y, Z, L = _chain()
    with codegen.compile_options(disk_cache=False):
        kern = tg.build([Z, L], [X, W])
    w = _rand(8, 4)
    for size in (2, 11):
        x = _rand(size, 8)
        rc, _, got = _export_and_run(kern, [size], [x, w], [(size - 1,), ()], tmp_path)
        assert rc == 0
        for g, e in zip(got, kern(x, w)):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    header = (tmp_path / "c" / "sym.h").read_text()
    assert "int sym(int64_t n, const float *X, const float *W, float *Z, float *L);" in header
    assert "#define SYM_ERROR_SIZE 5" in header and "size n: the value of size variable n, >= 2" in header
    rc, info, _ = _export_and_run(kern, [1], [_rand(1, 8), w], [(0,), ()], tmp_path)  # below min=2
    assert rc == 5 and info[:3] == [-1, 0, 1]
    rc, info, _ = _export_and_run(kern, [-3], [_rand(0, 8), w], [(0,), ()], tmp_path)
    assert rc == 5 and info[2] == -3


def test_build_vjp_compiles_one_forward_and_one_backward_for_every_size(count_compiles):
    n = tg.var("n", min=2)
    X = tg.placeholder((n, 8), name="X", dtype="float64")
    W = tg.placeholder((8, 4), name="W", dtype="float64")
    k = tg.reduce_axis(8, "k")
    Y = tg.compute((n, 4), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")
    Z = tg.compute((n - 1, 4), lambda i, j: tg.tanh(Y[i, j] + Y[i + 1, j]), name="Z")
    with codegen.compile_options(disk_cache=False):
        vjp = tg.build_vjp(Z, [X, W])
        assert vjp.forward.size_vars == (n,) and vjp.backward.size_vars == (n,)
        assert "n" in str(vjp.residual_bytes)
        w = _rand(8, 4, dtype="float64")
        for size in (2, 6, 13):
            x, h = _rand(size, 8, dtype="float64"), _rand(size - 1, 4, dtype="float64")
            outs, res = vjp.run_forward(x, w)
            gx, gw = vjp.run_backward(res, [x, w], [h])

            def loss(x, w):
                y = x @ w
                return float((np.tanh(y[:-1] + y[1:]) * h).sum())
            np.testing.assert_allclose(outs[0], np.tanh((x @ w)[:-1] + (x @ w)[1:]), rtol=1e-12)
            eps = 1e-6
            for g, arr in ((gx, x), (gw, w)):  # central finite differences in float64
                for idx in [tuple(RNG.integers(0, s) for s in arr.shape) for _ in range(4)]:
                    up, down = arr.copy(), arr.copy()
                    up[idx] += eps
                    down[idx] -= eps
                    fd = (loss(up, w) - loss(down, w)) / (2 * eps) if arr is x else \
                        (loss(x, up) - loss(x, down)) / (2 * eps)
                    assert abs(g[idx] - fd) < 1e-6 * max(1.0, abs(fd))
    assert len(count_compiles) == 2


def test_the_loop_interpreter_binds_sizes_and_agrees_with_the_oracle():
    from codegen.interpret import run
    from codegen.schedule import schedule_steps, stages_for
    from simplify import simplify
    n, X, W, Y, Z, L = _chain()
    outs = simplify([Z, L])
    stages = stages_for(outs)
    # the batch axis is split among threads, its extent bound at each call
    assert all(s.parallel_axis is not None for s in stages if s.tensor.shape)
    w = _rand(8, 4)
    for size in (2, 4):
        x = _rand(size, 8)
        got = run(stages, {X: x, W: w})
        want = tg.evaluate([Z, L], {X: x, W: w})
        for t, e in zip(outs, want):
            np.testing.assert_allclose(got[id(t)], e, rtol=1e-5, atol=1e-6)
    # every intermediate schedule of a symbolic tensor computes it: every pass runs
    from codegen.schedule import PASSES
    _, Xd, Wd, Yd, _, _ = _chain()
    steps = list(schedule_steps(Yd, Yd.op.body))
    assert [name for name, _ in steps] == ["definition"] + [p.name for p in PASSES if p.name != "packing"]
    x = _rand(3, 8)
    want = tg.evaluate([Yd], {Xd: x, Wd: w})[0]
    for name, stage in steps:
        np.testing.assert_allclose(run([stage], {Xd: x, Wd: w})[id(Yd)], want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_reads_proven_in_bounds_over_the_sizes_are_not_checked_the_others_are():
    n = tg.var("n", min=2)
    X = tg.placeholder((n, 8), name="X")
    W = tg.placeholder((8, 4), name="W")
    k = tg.reduce_axis(8, "k")
    Y = tg.compute((n, 4), lambda i, j: tg.sum(X[i, k] * W[k, j], axis=k), name="Y")
    Z = tg.compute((n - 1,), lambda i: tg.tanh(Y[i, 0] + Y[i + 1, 1]), name="Z")
    with codegen.compile_options(disk_cache=False):
        proven = tg.build(Z, [X, W])
    assert "ret i32 1" not in proven.llvm_ir  # no index check left: every read is proven
    # a read past the end under a condition on data: checked where it runs, as the oracle does
    V = tg.placeholder((n,), name="V")
    S = tg.compute((n,), lambda i: tg.if_then_else(V[i] > 0, V[i + 1], V[i]), name="S")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(S, [V])
    v = np.array([1.0, 2.0, -3.0], np.float32)
    np.testing.assert_array_equal(kern(v), tg.evaluate([S], {V: v})[0])
    with pytest.raises(UserError, match=r"index 3 is out of range \[0, 3\)"):
        kern(np.array([1.0, 2.0, 3.0], np.float32))
    # under the same condition, reads inside [0, n) for every n are not checked: one check left
    T = tg.compute((n,), lambda i: tg.if_then_else(V[i] > 0, V[i + 1], V[i] * V[n - 1 - i]), name="T")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(T, [V])
    assert kern.wait()._compiled.text.count("icmp uge") == 1  # V[i + 1] alone
    v = np.array([-1.0, 2.0, -3.0, -0.5], np.float32)
    np.testing.assert_allclose(kern(v), tg.evaluate([T], {V: v})[0])


def test_threads_share_a_range_known_at_run_time():
    n = tg.var("n", min=1)
    X = tg.placeholder((n, 300), name="X")
    r = tg.reduce_axis(300, "r")
    M = tg.compute((n,), lambda i: tg.max(X[i, r], axis=r), name="M")
    E = tg.compute((n, 300), lambda i, j: tg.exp(X[i, j] - M[i]), name="E")
    with codegen.compile_options(disk_cache=False):
        kern = tg.build([M, E], [X], threads=2)
    for size in (1, 7, 513):  # 513 rows: past the size the plan's structure was chosen at
        x = _rand(size, 300)
        records = kern._plan_records(kern._size_values({n: size}))
        assert (records[:, 3] == size).any()  # the extent split among threads is the bound n
        got = kern(x)
        for g, e in zip(got, tg.evaluate([M, E], {X: x})):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match="single-threaded"):
        kern.export("/nonexistent/k", threads=2)


def test_the_fuzzer_checks_one_symbolic_kernel_at_every_size_of_its_sized_programs():
    from te_grad.tools.fuzz import Program, check, from_seed
    sized = [src for src in (from_seed(s).source for s in range(120)) if "SIZE = n = tg.var" in src][:8]
    assert len(sized) >= 5
    for src in sized:
        outcome = check(Program(src), seed=0)
        assert outcome.kind in ("ok", "fd-unstable"), (outcome, src)


def test_a_size_that_makes_an_extent_negative_is_named_by_the_kernel():
    n = tg.var("n")
    X = tg.placeholder((n,), name="X")
    Z = tg.compute((n - 1,), lambda i: X[i] + X[i + 1], name="Z")
    kern = tg.build([Z], [X])
    with pytest.raises(UserError, match=r"at n = 0 the extent n - 1 of Z \(dimension 0\) is -1"):
        kern(np.zeros(0, np.float32))
    np.testing.assert_allclose(kern(np.arange(3, dtype=np.float32)), [1, 3])


def test_run_pointers_names_a_size_that_makes_an_intermediate_negative():
    """run_pointers takes its sizes by name (a framework's tensors): intermediates allocated at
    new sizes are checked there too, never numpy's negative-dimensions error."""
    n = tg.var("n")
    X = tg.placeholder((n, 4), name="X")
    k = tg.reduce_axis(4, "k")
    T = tg.compute((n - 1,), lambda i: tg.sum(tg.exp(X[i, k] + X[i + 1, k]), axis=k), name="T")
    Z = tg.compute((n - 1,), lambda i: T[i] * T[i] + T[i], name="Z")
    kern = tg.build([Z], [X])
    assert any(t.name == "T" for t in kern.buffers)  # an intermediate, allocated per sizes
    with pytest.raises(UserError, match=r"at n = 0 the extent n - 1 of T \(dimension 0\) is -1"):
        kern.run_pointers([0], [0], sizes={"n": 0})
