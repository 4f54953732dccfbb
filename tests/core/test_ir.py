"""The IR: immutability, structural equality and hashing, visitors, graph queries."""
import dataclasses

import numpy as np
import pytest

import te_grad as tg
from te_grad import ir
from te_grad.graph import (consumers, free_vars, placeholders_of, reads_in, tensors_read,
                           topo_order)
from te_grad.visitor import Mutator, Visitor


def build(X, i, j):
    return tg.exp(X[i, j] * 2.0 + 1.0) - tg.if_then_else(i < j, X[j, i], 0.0)


# ---------------------------------------------------------------------------
# immutability
# ---------------------------------------------------------------------------


def test_expression_nodes_are_immutable():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    k = tg.reduce_axis(3, "k")
    e = X[i, j] + 1.0
    r = tg.sum(X[i, k], axis=k)
    for node, attr, value in [(e, "a", X[j, i]), (e, "op", "sub"), (tg.const(1.0), "value", 2.0),
                              (i, "name", "z"), (k, "hi", tg.const(4)), (X[i, j], "indices", (j, i)),
                              (r, "combiner", "max"), (i < j, "op", "gt")]:
        with pytest.raises(AttributeError):
            setattr(node, attr, value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(node, attr, value)
    assert e.op == "add" and k.hi.value == 3 and r.combiner == "sum"


def test_tensors_are_immutable():
    X = tg.placeholder((3,), name="X")
    T = tg.compute((3,), lambda i: X[i] * 2.0, name="T")
    for t in (X, T):
        with pytest.raises(AttributeError):
            t.name = "Y"
        with pytest.raises(AttributeError):
            t.shape = (4,)
    assert X.name == "X" and T.shape == (3,)


def test_children_are_tuples():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    r = X[i, j]
    assert isinstance(r.indices, tuple)
    k = tg.reduce_axis(3, "k")
    s = tg.sum(X[i, k], axis=[k])
    assert isinstance(s.axes, tuple) and s.axes[0] is k
    assert isinstance(tg.exp(X[i, j]).args, tuple)


# ---------------------------------------------------------------------------
# structural equality and hashing
# ---------------------------------------------------------------------------


def test_structural_equality_of_separately_built_expressions():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    a, b = build(X, i, j), build(X, i, j)
    assert a is not b
    assert a.same_as(b) and b.same_as(a)
    assert hash(a) == hash(b)
    assert bool(a == b) and not bool(a != b)
    # a different constant, operator, variable or tensor breaks equality
    assert not (X[i, j] + 1.0).same_as(X[i, j] + 2.0)
    assert not (X[i, j] + 1.0).same_as(X[i, j] - 1.0)
    assert not (X[i, j] + 1.0).same_as(X[j, i] + 1.0)
    Y = tg.placeholder((3, 3), name="X")  # same name and shape, different tensor
    assert not X[i, j].same_as(Y[i, j])
    assert not tg.const(1, "int64").same_as(tg.const(1, "int32"))
    assert not tg.const(1.0).same_as(tg.const(1.0, "float64"))
    assert tg.const(1.0).same_as(tg.const(1.0))


def test_reductions_are_equal_when_they_share_their_axes():
    X = tg.placeholder((3, 4), name="X")
    i = ir.Var("i")
    k = tg.reduce_axis(4, "k")
    k2 = tg.reduce_axis(4, "k")
    assert tg.sum(X[i, k], axis=k).same_as(tg.sum(X[i, k], axis=k))
    assert hash(tg.sum(X[i, k], axis=k)) == hash(tg.sum(X[i, k], axis=k))
    assert not tg.sum(X[i, k], axis=k).same_as(tg.max(X[i, k], axis=k))
    assert not tg.sum(X[i, k], axis=k).same_as(tg.sum(X[i, k], axis=k, where=k < 2))
    assert not tg.sum(X[i, k], axis=k).same_as(tg.sum(X[i, k2], axis=k2))


def test_vars_and_tensors_have_identity_semantics():
    i1, i2 = ir.Var("i"), ir.Var("i")
    assert i1.same_as(i1)
    assert not i1.same_as(i2)
    assert hash(i1) != hash(i2)
    assert not bool(i1 == i2) and bool(i1 == i1)
    assert len({i1, i2}) == 2
    k1, k2 = tg.reduce_axis(3, "k"), tg.reduce_axis(3, "k")
    assert not k1.same_as(k2) and len({k1, k2}) == 2
    X, Y = tg.placeholder((3,), name="X"), tg.placeholder((3,), name="X")
    assert X is not Y and len({X, Y}) == 2
    assert {X: 1, Y: 2}[X] == 1


def test_equality_operator_builds_ir():
    i, j = ir.Var("i"), ir.Var("j")
    c = i == j
    assert isinstance(c, ir.Compare) and c.op == "eq" and c.dtype == "bool"
    assert c.a is i and c.b is j
    assert isinstance(i != 3, ir.Compare) and (i != 3).op == "ne"


def test_expressions_as_dict_keys_and_in_sets():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    table = {build(X, i, j): "first", X[i, j]: "read", i: "var"}
    assert table[build(X, i, j)] == "first"
    assert table[X[i, j]] == "read"
    assert table[i] == "var"
    assert X[j, i] not in table
    assert ir.Var("i") not in table
    assert len({build(X, i, j), build(X, i, j), X[i, j], X[i, j]}) == 2
    assert X[i, j] in [X[j, i], X[i, j]]


def test_hash_is_cached():
    X = tg.placeholder((3,), name="X")
    i = ir.Var("i")
    e = X[i] * 2.0 + 1.0
    h = hash(e)
    assert e.__dict__.get("_hash") == h
    assert hash(e) == h


def test_children_order():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    s = tg.if_then_else(i < j, X[i, j], 0.0)
    c = s.children()
    assert len(c) == 3 and c[0].same_as(i < j) and c[1].same_as(X[i, j])
    assert [type(ch) for ch in X[i, j].children()] == [ir.Var, ir.Var]
    assert all(a is b for a, b in zip(X[i, j].children(), (i, j)))
    assert i.children() == ()
    k = tg.reduce_axis((1, 3), "k")
    assert [ch.value for ch in k.children()] == [1, 3]


def test_reduce_axis_extent():
    assert tg.reduce_axis(5).extent == 5
    assert tg.reduce_axis((2, 9)).extent == 7
    i = ir.Var("i")
    assert ir.ReduceAxis("k", "int64", tg.const(0), i + 1).extent is None


def test_tensor_properties():
    X = tg.placeholder((2, 3, 4), dtype="int32", name="X")
    assert X.ndim == 3 and X.size == 24 and X.is_placeholder
    assert repr(X) == "Tensor(X: int32[2, 3, 4], placeholder)"
    T = tg.compute((2,), lambda i: X[i, 0, 0], name="T")
    assert not T.is_placeholder and isinstance(T.op, ir.ComputeOp)
    assert repr(T) == "Tensor(T: int32[2], compute)"
    assert bool(X)
    assert "<pre" in X._repr_html_()


# ---------------------------------------------------------------------------
# visitor and mutator
# ---------------------------------------------------------------------------


class CountReads(Visitor):
    def __init__(self):
        self.names = []

    def visit_Read(self, node):
        self.names.append(node.tensor.name)
        self.generic_visit(node)


def test_visitor_walks_everything():
    X = tg.placeholder((4,), name="X")
    ids = tg.placeholder((4,), dtype="int64", name="ids")
    k = tg.reduce_axis(4, "k")
    i = ir.Var("i")
    e = tg.sum(X[ids[k]], axis=k, where=X[k] > 0) + X[i]
    v = CountReads()
    v.visit(e)
    assert sorted(v.names) == ["X", "X", "X", "ids"]


class ReplaceConst(Mutator):
    def __init__(self, old, new):
        super().__init__()
        self.old, self.new = old, new

    def visit_Const(self, node):
        if node.value == self.old:
            return tg.const(self.new, node.dtype)
        return node


def test_mutator_returns_the_same_node_when_nothing_changed():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    k = tg.reduce_axis(3, "k")
    e = build(X, i, j) + tg.sum(X[i, k], axis=k, where=k < j)
    assert Mutator().visit(e) is e
    assert ReplaceConst(42.0, 0.0).visit(e) is e


def test_mutator_rebuilds_only_what_changed():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    left = tg.exp(X[i, j])
    right = X[j, i] * 2.0
    e = left + right
    new = ReplaceConst(2.0, 3.0).visit(e)
    assert new is not e
    assert new.same_as(tg.exp(X[i, j]) + X[j, i] * 3.0)
    assert new.a is left            # the unchanged subtree is shared
    assert new.b is not right and new.b.a is right.a
    assert e.b.b.value == 2.0       # the original is untouched


def test_mutator_renames_axes_whose_bounds_change():
    X = tg.placeholder((5,), name="X")
    k = tg.reduce_axis(4, "k")
    T = tg.compute((1,), lambda i: tg.sum(X[k], axis=k) + 0.0 * i, name="T")
    body = T.op.body
    new_body = ReplaceConst(4, 2).visit(body)
    red = new_body.a
    assert isinstance(red, ir.Reduce)
    new_k = red.axes[0]
    assert new_k is not k and new_k.name == "k" and new_k.hi.value == 2
    assert red.body.indices[0] is new_k    # uses were renamed to the fresh axis
    assert k.hi.value == 4                 # the old axis is untouched
    U = ir.Tensor("U", (1,), "float32", ir.ComputeOp(T.op.axes, new_body))
    x = np.arange(5, dtype=np.float32) + 1
    t, u = tg.evaluate([T, U], {X: x})
    assert t.tolist() == [10.0] and u.tolist() == [3.0]


def test_mutator_visits_shared_nodes_once():
    X = tg.placeholder((3,), name="X")
    i = ir.Var("i")
    shared = X[i] + 1.0
    e = shared * shared

    class Count(Mutator):
        n = 0

        def visit_Read(self, node):
            Count.n += 1
            return self.generic_visit(node)
    out = Count().visit(e)
    assert out is e and Count.n == 1


# ---------------------------------------------------------------------------
# graph queries
# ---------------------------------------------------------------------------


def test_free_vars():
    X = tg.placeholder((3, 3), name="X")
    i, j = ir.Var("i"), ir.Var("j")
    k = tg.reduce_axis(3, "k")
    e = X[i, 0] + tg.sum(X[j, k], axis=k, where=k < i)
    fv = free_vars(e)
    assert len(fv) == 2 and fv[0] is i and fv[1] is j
    assert free_vars(tg.const(1.0)) == ()
    # an axis outside its reduction is free
    fv = free_vars(X[i, k])
    assert len(fv) == 2 and fv[1] is k
    # variables in the bounds of a reduce axis are free
    tri = ir.ReduceAxis("t", "int64", tg.const(0), j + 1)
    fv = free_vars(tg.sum(X[i, tri], axis=tri))
    assert {id(v) for v in fv} == {id(i), id(j)}


def test_free_vars_of_bounds_that_use_earlier_axes():
    X = tg.placeholder((4, 4), name="X")
    k1 = tg.reduce_axis(4, "k1")
    k2 = ir.ReduceAxis("k2", "int64", tg.const(0), k1 + 1)
    assert free_vars(tg.sum(X[k1, k2], axis=[k1, k2])) == ()
    # the same reduction is accepted by compute and evaluates the lower triangle
    T = tg.compute((), lambda: tg.sum(X[k1, k2], axis=[k1, k2]))
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert tg.evaluate([T], {X: x})[0] == np.tril(x).sum()


def test_reads_and_tensors_read():
    X = tg.placeholder((4,), name="X")
    ids = tg.placeholder((4,), dtype="int64", name="ids")
    i = ir.Var("i")
    e = X[ids[i]] + X[i] * ids[0]
    reads = reads_in(e)
    assert [r.tensor.name for r in reads] == ["X", "ids", "X", "ids"]
    ts = tensors_read(e)
    assert len(ts) == 2 and ts[0] is X and ts[1] is ids


def test_topo_order_of_a_diamond():
    A = tg.placeholder((3,), name="A")
    B = tg.placeholder((3,), name="B")
    L = tg.compute((3,), lambda i: A[i] * 2.0, name="L")
    R = tg.compute((3,), lambda i: A[i] + B[i], name="R")
    J = tg.compute((3,), lambda i: L[i] + R[i] + A[i], name="J")
    K = tg.compute((3,), lambda i: J[i] - L[i], name="K")
    order = topo_order([K])
    assert len(order) == 6 and len({id(t) for t in order}) == 6
    pos = {id(t): n for n, t in enumerate(order)}
    for t in order:
        for dep in t.op.inputs():
            assert pos[id(dep)] < pos[id(t)], (dep.name, t.name)
    assert order[-1] is K
    # several outputs, repeated outputs and outputs that are inputs of others
    order2 = topo_order([L, K, L, A])
    assert len(order2) == 6
    assert [t.name for t in placeholders_of([K])] in (["A", "B"], ["B", "A"])
    assert [t.name for t in placeholders_of([L])] == ["A"]
    cons = consumers(order)
    assert {t.name for t in cons[id(A)]} == {"L", "R", "J"}
    assert [t.name for t in cons[id(K)]] == []
    assert topo_order([A]) == [A]


def test_topo_order_of_a_long_chain():
    T = tg.placeholder((2,), name="T0")
    chain = [T]
    def step(prev, n):
        return tg.compute((2,), lambda i: prev[i] + 1.0, name=f"T{n}")
    for n in range(300):
        chain.append(step(chain[-1], n + 1))
    order = topo_order([chain[-1]])
    assert [t.name for t in order] == [t.name for t in chain]
    out = tg.evaluate([chain[-1]], {T: np.zeros(2, np.float32)})[0]
    assert out.tolist() == [300.0, 300.0]
