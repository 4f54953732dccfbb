"""Schedules sized by the machine description: register blocks and cache tiles.

The decisions are asserted on the stages that ``stages_for`` builds for a given
:class:`codegen.machine.Machine`, and every kernel built for such a machine is
compared with the reference evaluator in float64.
"""
import numpy as np
import pytest

import te_grad as tg
from codegen.loopir import Loop, register_blocks
from codegen.machine import PORTABLE, Machine, _sys_cache_bytes, host_machine
from codegen.schedule import stages_for
from simplify import simplify

RNG = np.random.default_rng(5)
AVX2 = Machine(vector_bits=256, vector_registers=16, l1_bytes=32 * 1024, l2_bytes=1 << 20)
AVX512 = Machine(vector_bits=512, vector_registers=32, l1_bytes=48 * 1024, l2_bytes=2 << 20)


def tiny_cache(machine: Machine, l2_bytes: int) -> Machine:
    return Machine(machine.vector_bits, machine.vector_registers, machine.l1_bytes, l2_bytes)


def matmul(n, m, p, transposed=False, dtype="float64"):
    """``X @ W`` (``W[k, j]``) or, transposed, ``X @ W.T`` as nn.dense reads it (``W[j, k]``)."""
    x = tg.placeholder((n, m), name="X", dtype=dtype)
    w = tg.placeholder((p, m) if transposed else (m, p), name="W", dtype=dtype)
    k = tg.reduce_axis(m, "k")
    if transposed:
        y = tg.compute((n, p), lambda i, j: tg.sum(x[i, k] * w[j, k], axis=k), name="Y")
    else:
        y = tg.compute((n, p), lambda i, j: tg.sum(x[i, k] * w[k, j], axis=k), name="Y")
    return y, [x, w]


def tile_loops(stage):
    """The stage's top-level loops over cache tiles: serial loops around its parallel loop."""
    def has_parallel(stmts):
        return any(isinstance(s, Loop) and (s.parallel or has_parallel(s.body)) for s in stmts)
    return [s for s in stage.body if isinstance(s, Loop) and not s.parallel and has_parallel(s.body)]


def stage_of(y, machine):
    stages = stages_for(simplify([y]), machine)
    return next(s for s in stages if s.tensor is y or s.tensor.name == "Y")


def compare(outputs, inputs, machine):
    feed = {x: RNG.standard_normal(x.shape) for x in inputs}
    want = tg.evaluate(outputs, feed)
    got = tg.build(outputs, inputs, machine=machine)(*[feed[x] for x in inputs])
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("machine,bits,accumulators", [(AVX2, 256, 12), (AVX512, 512, 24)])
def test_register_blocks_are_sized_by_the_machine(machine, bits, accumulators):
    y, _ = matmul(64, 64, 64)
    blocks = list(register_blocks(stage_of(y, machine).body))
    assert blocks and all(b.vector_bits == bits and b.accumulators == accumulators for b in blocks)
    assert all(b.jam <= accumulators for b in blocks)


def test_lanes_along_a_reduce_axis_stay_at_256_bits():
    # 8 rows: too few to repay a packed copy of W, so the lanes run along k
    y, _ = matmul(8, 64, 64, transposed=True, dtype="float32")
    blocks = list(register_blocks(stage_of(y, AVX512).body))
    assert blocks and all(b.reduce_lanes and b.vector_bits == 256 for b in blocks)


def packed_stages(y, machine=AVX512):
    return [s.tensor.name for s in stages_for(simplify([y]), machine) if s.tensor.name.endswith("_packed")]


def test_x_at_w_transposed_reads_a_packed_copy_of_w():
    y, inputs = matmul(64, 48, 40, transposed=True)
    assert packed_stages(y) == ["W_packed"]
    blocks = list(register_blocks(stage_of(y, AVX512).body))
    assert blocks and not any(b.reduce_lanes for b in blocks)  # lanes along the output columns
    compare([y], inputs, AVX512)


def test_batched_q_at_k_transposed_is_packed_and_exact():
    q = tg.placeholder((3, 32, 48), name="Q", dtype="float64")
    kk = tg.placeholder((3, 40, 48), name="K", dtype="float64")
    y = tg.nn.batch_matmul(q, kk, transpose_b=True)
    assert len(packed_stages(y)) == 1
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    compare([y] + tg.gradient(y, [q, kk], head=head), [q, kk, head], AVX512)


def test_no_packed_copy_for_few_rows_or_a_short_reduction():
    assert packed_stages(matmul(8, 64, 64, transposed=True)[0]) == []
    assert packed_stages(matmul(64, 8, 64, transposed=True)[0]) == []
    assert packed_stages(matmul(64, 64, 64)[0]) == []  # X @ W: W is contiguous along j already


def test_no_tiles_when_the_operand_fits():
    y, _ = matmul(64, 64, 64)
    assert tile_loops(stage_of(y, AVX512)) == []


def test_x_at_w_is_tiled_along_the_reduction():
    # W is 64 x 64 float64 = 32 KiB; half of a 16 KiB cache takes 16 of its rows
    y, inputs = matmul(64, 64, 64)
    small = tiny_cache(AVX512, 16 * 1024)
    tiles = tile_loops(stage_of(y, small))
    # the block of whole jammed rows, and the one of the rows past them: each tiled
    assert len(tiles) == 2 and all(t.hi.value == 4 for t in tiles)
    compare([y], inputs, small)


def test_x_at_w_transposed_is_tiled_along_the_output_columns():
    y, inputs = matmul(12, 64, 64, transposed=True)  # 12 rows: not packed
    small = tiny_cache(AVX2, 16 * 1024)
    tiles = tile_loops(stage_of(y, small))
    assert len(tiles) == 1
    # the loop cut runs over output columns (blocks of j), not over the reduction
    blocks = list(register_blocks(stage_of(y, small).body))
    assert all(lp.var.name == "k" and lp.lo.value == 0 for b in blocks for lp in b.loops)
    compare([y], inputs, small)


@pytest.mark.parametrize("n", [61, 67, 100])
def test_tiles_that_do_not_divide_the_loop(n):
    for transposed in (False, True):
        y, inputs = matmul(12, n, n, transposed=transposed)  # 12 rows: X @ W.T is not packed
        small = tiny_cache(AVX512, 16 * 1024)
        assert tile_loops(stage_of(y, small)), "expected a tiled nest"
        assert packed_stages(y, small) == []
        compare([y], inputs, small)


def test_convolution_and_its_gradients_with_a_tiny_cache():
    x = tg.placeholder((2, 8, 10, 10), name="X", dtype="float64")
    w = tg.placeholder((16, 8, 3, 3), name="W", dtype="float64")
    y = tg.nn.conv2d(x, w, stride=1, padding=1)
    head = tg.placeholder(y.shape, name="H", dtype="float64")
    small = tiny_cache(AVX512, 4 * 1024)
    compare([y] + tg.gradient(y, [x, w], head=head), [x, w, head], small)


def test_float32_kernels_for_every_machine_agree_with_the_evaluator():
    y, inputs = matmul(40, 96, 72, dtype="float32")
    feed = {x: RNG.standard_normal(x.shape).astype(np.float32) for x in inputs}
    y64, inputs64 = matmul(40, 96, 72)
    want = tg.evaluate([y64], {x: feed[x32].astype(np.float64) for x, x32 in zip(inputs64, inputs)})[0]
    for machine in (AVX2, AVX512, tiny_cache(AVX512, 4096), PORTABLE):
        got = tg.build([y], inputs, machine=machine)(*[feed[x] for x in inputs])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_host_is_described():
    m = host_machine()
    assert m.vector_bits in (128, 256, 512) and m.vector_registers in (16, 32)
    assert m.l1_bytes > 0 and m.l2_bytes > 0
    assert m.lanes("float32") == 2 * m.lanes("float64")


def test_cache_sizes_are_read_from_sys(tmp_path):
    for name, level, kind, size in [("index0", 1, "Data", "48K"), ("index1", 1, "Instruction", "32K"),
                                    ("index2", 2, "Unified", "2048K"), ("index3", 3, "Unified", "30M")]:
        d = tmp_path / name
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    assert _sys_cache_bytes(1, str(tmp_path)) == 48 * 1024
    assert _sys_cache_bytes(2, str(tmp_path)) == 2 * 1024 * 1024
    assert _sys_cache_bytes(3, str(tmp_path)) == 30 * 1024 * 1024
    assert _sys_cache_bytes(4, str(tmp_path)) is None
    assert _sys_cache_bytes(1, str(tmp_path / "missing")) is None


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n", [3, 9, 17, 24, 33, 34, 40, 47, 65])
def test_rows_of_any_length_with_a_narrower_last_block(dtype, n):
    # a row of 34 is a block of 32 lanes and an overlapping one of 8; 40 (float64) ends
    # with a block that fits exactly
    y, inputs = matmul(6, 20, n, dtype=dtype)
    y64, inputs64 = matmul(6, 20, n)
    feed = {x: RNG.standard_normal(x.shape).astype(dtype) for x in inputs}
    want = tg.evaluate([y64], {x: feed[x32].astype(np.float64) for x, x32 in zip(inputs64, inputs)})[0]
    for machine in (AVX2, AVX512):
        got = tg.build([y], inputs, machine=machine)(*[feed[x] for x in inputs])
        tol = 1e-12 if dtype == "float64" else 1e-4
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
