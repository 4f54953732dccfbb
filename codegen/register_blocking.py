"""Register blocking: the loops of one reduction term, innermost run kept in vector registers.

:func:`accumulate_nest` turns a loop order for ``T[j] = combine(T[j], body)`` into
loops. When the innermost loop runs over an output axis with reduce loops just
outside it (or over a reduce axis whose lanes can combine at the end), those
loops become one register block (a nest annotated :class:`~codegen.loopir.RegisterBlocked`),
sized for the machine
(:func:`block_vector_bits`, :func:`accumulator_registers`), with up to two
serial output loops and the split one unrolled and jammed into it
(:func:`_jam_choices`). :func:`block_registers` is the pass over a stage.

Promises: the nest computes exactly the term (a block's annotation never changes
its meaning: its body is the plain nest, which the emitter falls back to when it
cannot prove a vector form safe); each thread of the split loop takes whole jammed
blocks.
"""
from __future__ import annotations

from typing import List, Tuple

from te_grad import dsl
from te_grad.graph import free_vars, reads_in
from te_grad.ir import Const, Var
from te_grad.ops import reduction

from .loopir import SERIAL, Jam, Loop, Nest, Parallel, Stage, Store, guarded, nest, register_block, rewrite_nests
from .machine import Machine


def accumulate_nest(order: List[Var], bounds, store: Store, cond, parallel, out_axes,
                     machine: Machine) -> List:
    """The loops of one reduction term; when the innermost loop runs over an output axis
    with reduce loops just outside it, those become a register block."""
    inner_var = order[-1]
    k = len(order) - 1
    while k > 0 and not any(order[k - 1] is a for a in out_axes):
        k -= 1
    reduce_suffix = order[k:-1]
    inner_is_output = any(inner_var is a for a in out_axes)
    constant = isinstance(bounds[id(inner_var)][0], Const) and isinstance(bounds[id(inner_var)][1], Const)
    red = reduction(store.combine) if store.combine is not None else None
    lanes_on_reduction = not inner_is_output and red is not None and red.lowering != "mul" and not red.indexed
    if constant and inner_var is not parallel and (inner_is_output and reduce_suffix or lanes_on_reduction):
        loops = [Loop(v, *bounds[id(v)], ()) for v in reduce_suffix]
        accumulators = accumulator_registers(machine)
        outer = list(order[:k])
        bounds = dict(bounds)
        jams = []
        scaled = None
        for var, factor in _jam_choices(outer, bounds, store, parallel, out_axes, accumulators):
            jam_outer = Var(var.name + "o")
            lo, hi = (int(b.value) for b in bounds[id(var)])
            jams.append(Jam(var, jam_outer, factor, base=lo))
            bounds[id(jam_outer)] = (dsl.const(0), dsl.const((hi - lo) // factor))
            outer = [jam_outer if v is var else v for v in outer]
            if var is parallel:
                scaled = (jam_outer, factor)
        block = register_block(inner_var, *bounds[id(inner_var)], loops, cond, store, jams,
                               reduce_lanes=not inner_is_output,
                               vector_bits=block_vector_bits(machine, reduce_lanes=not inner_is_output),
                               accumulators=accumulators)
        body: List = [block]
        for v in reversed(outer):
            lo, hi = bounds[id(v)]
            if scaled is not None and v is scaled[0]:  # threads take whole blocks of the split axis
                body = [Loop(v, lo, hi, body, Parallel(scale=scaled[1]))]
            else:
                body = [Loop(v, lo, hi, body, Parallel() if v is parallel else SERIAL)]
        return body
    return nest(order, bounds, guarded(cond, store), parallel)


def block_registers(stage: Stage, machine: Machine) -> Stage:
    """Each accumulating nest of ``stage`` (its loops ordered) through :func:`accumulate_nest`."""
    def block(n: Nest):
        if not n.accumulates or not n.loops:
            return None
        return accumulate_nest(n.order, n.bounds, n.store, n.cond, n.parallel, n.outputs, machine)
    return rewrite_nests(stage, block)


#: the fewest blocks a jammed split axis keeps for the threads
MIN_SPLIT_BLOCKS = 8


def accumulator_registers(machine: Machine) -> int:
    """Vector registers a register block's accumulators may take: three quarters of the
    machine's (12 of AVX2's 16, 24 of AVX-512's 32), the rest for operands."""
    return machine.vector_registers * 3 // 4


def block_vector_bits(machine: Machine, reduce_lanes: bool) -> int:
    """Bits of the vectors of a register block: the machine's widest, except that lanes
    along a reduce axis stay at 256 bits. Such a block loads a vector of every operand
    for each multiply-add, and with 512-bit vectors it is limited by loads from the
    cache (on an AVX-512 Xeon, a 1024-square ``X @ W.T`` ran at 83-86 GFLOP/s with
    512-bit vectors against 97 with 256-bit ones; ``X @ W``, which broadcasts one
    operand, gains from 79 to 131)."""
    return machine.vector_bits if not reduce_lanes else min(machine.vector_bits, 256)


def _jam_choices(outer: List[Var], bounds, store: Store, parallel, out_axes,
                 max_copies: int) -> List[Tuple[Var, int]]:
    """Output loops to unroll-and-jam into the register block, with their factors.

    Each must have constant bounds ``[lo, hi)`` with ``hi - lo`` divisible by its factor
    (``lo`` is 0 for the split loop, whose threads take ranges of blocks), must not bound other
    loops, and some read of the body must not depend on it (that read is then shared by
    the jammed copies). First the innermost such loop that is not split among threads
    and the next such loop out, each by 4, 3 or 2 (a block of ``Q @ K.T`` then
    shares each row of ``Q`` among columns and each row of ``K`` among rows); then the
    split loop itself, by the largest of 8, 6, 4, 3, 2; at most ``max_copies`` copies in
    all, and at least :data:`MIN_SPLIT_BLOCKS` blocks of the split loop for the threads."""
    reads = reads_in(store.value)

    def eligible(v):
        if not any(v is a for a in out_axes):
            return False
        lo, hi = bounds[id(v)]
        if not (isinstance(lo, Const) and isinstance(hi, Const)) or (v is parallel and lo.value != 0):
            return False
        # no loop (outer, or inside the block) may have bounds that use v: the jammed copies
        # run those loops once, for all values of v together
        if any(v is x for k, lo_hi in bounds.items() if k != id(v) for b in lo_hi for x in free_vars(b)):
            return False
        return any(all(not any(x is v for x in free_vars(i)) for i in r.indices) for r in reads)

    chosen: List[Tuple[Var, int]] = []
    copies = 1
    for v in reversed(outer):
        if v is not parallel and eligible(v):
            n = bounds[id(v)][1].value - bounds[id(v)][0].value
            factor = next((f for f in (4, 3, 2) if n % f == 0 and n >= f and copies * f <= max_copies), None)
            if factor is not None:
                chosen.append((v, factor))
                copies *= factor
                if len(chosen) == 2:
                    break
    if parallel is not None and any(parallel is v for v in outer) and eligible(parallel):
        n = bounds[id(parallel)][1].value
        factor = next((f for f in (8, 6, 4, 3, 2) if n % f == 0 and n // f >= MIN_SPLIT_BLOCKS
                       and copies * f <= max_copies), None)
        if factor is not None:
            chosen.append((parallel, factor))
    return chosen
