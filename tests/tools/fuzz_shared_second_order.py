# A fuzzer program whose second-order gradient shares subexpressions heavily: its simplified
# gradient dX0 is a DAG of about 5,400 nodes whose tree has 480,000. Once, the demand walk of
# simplify/zeros.py followed every path of it (minutes, calling isl on each) and the LLVM
# emitter emitted every path (a 59 MB stage function that kept emit_object busy for
# minutes). tests/tools/test_fuzz.py::test_a_second_order_gradient_with_heavy_sharing_builds
# checks it.
# a random te_grad program (te_grad.tools.fuzz); DT is the float dtype
C = lambda value: tg.const(value, DT)
X0 = tg.placeholder((3, 2), dtype=DT, name='X0')
X1 = tg.placeholder((3,), dtype=DT, name='X1')
S0 = tg.compute((), lambda : tg.cast(DT, X0[2, 0]), name='S0')
k0 = tg.reduce_axis((0, 1), name='k0')
k1 = tg.reduce_axis((1, 2), name='k1')
S1 = tg.compute((4, 3), lambda i0, i1: tg.cast(DT, tg.atan2(tg.if_then_else(tg.if_then_else(i0 <= i1, X1[i1], X1[((1 * i0 + 1 * i0 + 0) % 3)]) > X1[((3 * i1 + 1)) % 3], tg.if_then_else(tg.all(i0 + 1 >= 0, i0 + 1 < 3), X1[i0 + 1], C(0.25)), C(-0.75)), (tg.if_then_else(tg.prod(tg.tanh(X0[((2 - i0)) % 3, (i0) % 2]) * 0.5 + 1.0, axis=[k0, k1]) > X0[(i0) % 3, 0], X0[(i0) % 3, (i1) % 2], S0[()]) + tg.minimum((X0[i1, (i0) % 2] / (X1[((2 * i0 + 1)) % 3] * X1[((2 * i0 + 1)) % 3] + 0.5)), tg.log(X0[(i0) % 3, (i0) % 2] * X0[(i0) % 3, (i0) % 2] + 0.5))) * (tg.if_then_else(tg.prod(tg.tanh(X0[((2 - i0)) % 3, (i0) % 2]) * 0.5 + 1.0, axis=[k0, k1]) > X0[(i0) % 3, 0], X0[(i0) % 3, (i1) % 2], S0[()]) + tg.minimum((X0[i1, (i0) % 2] / (X1[((2 * i0 + 1)) % 3] * X1[((2 * i0 + 1)) % 3] + 0.5)), tg.log(X0[(i0) % 3, (i0) % 2] * X0[(i0) % 3, (i0) % 2] + 0.5))) + 0.3)), name='S1')
S2 = tg.compute((1,), lambda i0: tg.cast(DT, X0[((i0 + -2)) % 3, ((i0 + -2)) % 2]), name='S2')
S3 = tg.compute((), lambda : tg.cast(DT, S1[1, 1]), name='S3')
OUT = S3
STAGES = [S0, S1, S2, S3]
INPUTS = [X0, X1]
IDS = {}
SECOND = True  # check second order too: the gradient of <V, gradient>
