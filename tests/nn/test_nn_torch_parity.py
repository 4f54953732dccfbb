"""The te_grad.nn ops a PyTorch-model importer maps ATen onto, against PyTorch itself: forward
values and gradients (torch autograd, the same head) in float64 and float32, on a symbolic
batch (tg.var), and their bad inputs (UserErrors naming the op and the value)."""
import math

import numpy as np
import pytest

import te_grad as tg
from te_grad import nn
from te_grad.errors import UserError

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {"float64": 1e-10, "float32": 2e-5}
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")


def _compare(tg_fn, torch_fn, arrays, dtype, grad=True, seed=0, tol=None):
    """``tg_fn`` on placeholders and ``torch_fn`` on tensors of ``arrays`` (float ones cast to
    ``dtype``): equal outputs, and equal gradients of ``sum(out * head)`` for a random head."""
    tol = tol or TOL[dtype]
    arrays = [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]
    ins = [tg.placeholder(a.shape, dtype=str(a.dtype), name=f"a{k}") for k, a in enumerate(arrays)]
    outs = tg_fn(*ins)
    outs = outs if isinstance(outs, list) else [outs]
    feed = dict(zip(ins, arrays))
    got = tg.evaluate(outs, feed)
    tens = [torch.tensor(a, requires_grad=a.dtype.kind == "f" and grad) for a in arrays]
    want = torch_fn(*tens)
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.dtype == w.detach().numpy().dtype
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=tol, atol=tol)
    if not grad:
        return got
    rng = np.random.default_rng(seed)
    floats = [(t, x) for t, x, a in zip(ins, tens, arrays) if a.dtype.kind == "f"]
    heads = [rng.standard_normal(o.shape).astype(dtype) for o in outs]
    total = sum((w * torch.tensor(h)).sum() for w, h in zip(want, heads))
    want_g = torch.autograd.grad(total, [x for _, x in floats], allow_unused=True)
    loss_terms = [nn.sum(nn.multiply(o, tg.placeholder(o.shape, dtype=dtype, name=f"h{k}")))
                  for k, o in enumerate(outs)]
    loss = loss_terms[0]
    for t in loss_terms[1:]:
        loss = nn.add(loss, t)
    head_phs = [next(t for t in tg.graph.topo_order([lt]) if t.name == f"h{k}") for k, lt in enumerate(loss_terms)]
    feed.update(zip(head_phs, heads))
    got_g = tg.evaluate(list(tg.differentiate(loss, [t for t, _ in floats])), feed)
    for (t, _), g, w in zip(floats, got_g, want_g):
        w = np.zeros_like(g) if w is None else w.numpy()
        np.testing.assert_allclose(g, w, rtol=tol * 10, atol=tol * 10, err_msg=f"gradient of {t.name}")
    return got


def rand(*shape, scale=1.0, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape) * scale


DTYPES = ["float64", "float32"]


# ----- activations -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(dtype, approximate):
    _compare(lambda x: nn.gelu(x, approximate), lambda x: F.gelu(x, approximate=approximate),
             [rand(3, 7, scale=3)], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_swiglu(dtype):
    _compare(nn.silu, F.silu, [rand(4, 5, scale=4)], dtype)
    _compare(nn.swiglu, lambda g, u: F.silu(g) * u, [rand(2, 3, 4, scale=3), rand(2, 3, 4, seed=1)], dtype)


def test_gelu_tanh_is_not_the_exact_gelu():
    x = tg.placeholder((5,), dtype="float64", name="x")
    v = np.linspace(-3, 3, 5)
    exact, approx = tg.evaluate([nn.gelu(x), nn.gelu(x, "tanh")], {x: v})
    assert np.abs(exact - approx).max() > 1e-4


# ----- rms_norm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axes", [-1, (-2, -1), (1, 2, 3)])
@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm(dtype, axes, with_weight):
    x = rand(2, 3, 4, 5)
    nshape = x.shape[-1:] if axes == -1 else x.shape[-len(axes):]
    args = [x, rand(*nshape, seed=3)] if with_weight else [x]
    _compare(lambda x_, *w: nn.rms_norm(x_, *w, axis=axes), lambda x_, *w: F.rms_norm(x_, nshape, *w), args, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_default_eps_is_the_dtypes_machine_epsilon(dtype):
    """Mean squares near the machine epsilon: the default eps shows in the values."""
    eps = float(torch.finfo(getattr(torch, dtype)).eps)
    x = rand(3, 4) * math.sqrt(eps)
    got = _compare(nn.rms_norm, lambda x_: F.rms_norm(x_, (4,)), [x], dtype)[0]
    x = x.astype(dtype)
    no_eps = x / np.sqrt((x * x).mean(-1, keepdims=True))
    assert np.abs(got - no_eps).max() > 1e-3
    _compare(lambda x_: nn.rms_norm(x_, eps=1e-3), lambda x_: F.rms_norm(x_, (4,), eps=1e-3), [x], dtype)


# ----- conv1d ------------------------------------------------------------------------------------

CONV1D = [
    ((2, 4, 9), (6, 4, 3), {}),
    ((2, 4, 9), (6, 2, 3), dict(stride=2, padding=2, dilation=2, groups=2)),
    ((1, 3, 8), (3, 1, 4), dict(padding="same", groups=3)),
    ((1, 2, 8), (4, 2, 3), dict(padding="same", dilation=3)),
    ((1, 2, 8), (4, 2, 3), dict(padding="valid", stride=3)),
    ((2, 2, 5), (4, 2, 2), dict(padding=(1,), stride=(2,), dilation=(1,))),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,kw", CONV1D, ids=[str(c[2]) for c in CONV1D])
def test_conv1d(dtype, bias, xs, ws, kw):
    args = [rand(*xs), rand(*ws, seed=1)] + ([rand(ws[0], seed=2)] if bias else [])
    _compare(lambda x, w, *b: nn.conv1d(x, w, *b, **kw), lambda x, w, *b: F.conv1d(x, w, *b, **kw), args, dtype)


# ----- chunk and split ---------------------------------------------------------------------------

@pytest.mark.parametrize("n,chunks", [(7, 3), (6, 4), (5, 4), (6, 3), (3, 5), (1, 2), (8, 1)])
def test_chunk(n, chunks):
    got = _compare(lambda x: nn.chunk(x, chunks, axis=1), lambda x: torch.chunk(x, chunks, dim=1),
                   [rand(2, n, 3)], "float64")
    assert len(got) == len(torch.chunk(torch.zeros(n), chunks))


@pytest.mark.parametrize("sizes", [2, 3, 7, 9, [2, 0, 5], [7], [1, 1, 1, 4]])
def test_split_sizes_is_torch_split(sizes):
    _compare(lambda x: nn.split(x, sizes=sizes, axis=-2), lambda x: torch.split(x, sizes, dim=-2),
             [rand(2, 7, 3)], "float64")


def test_split_numpy_form_is_unchanged():
    x = rand(7, 2)
    X = tg.placeholder(x.shape, dtype="float64", name="x")
    for arg in (7, [2, 5], [3, 9]):
        for g, w in zip(tg.evaluate(nn.split(X, arg), {X: x}), np.split(x, arg)):
            np.testing.assert_array_equal(g, w)


# ----- scaled_dot_product_attention ----------------------------------------------------------------

def _sdpa(**kw):
    return (lambda q, k, v, *m: nn.scaled_dot_product_attention(q, k, v, *m, **kw),
            lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m, **kw))


ATTENTION = [
    ("3d", (2, 4, 5), (2, 6, 5), (2, 6, 3), {}),
    ("4d", (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), {}),
    ("5d_scale", (2, 1, 2, 3, 4), (2, 1, 2, 5, 4), (2, 1, 2, 5, 2), dict(scale=0.3)),
    ("causal_square", (2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 3), dict(is_causal=True)),
    ("causal_more_queries", (1, 2, 6, 4), (1, 2, 3, 4), (1, 2, 3, 3), dict(is_causal=True)),
    ("causal_more_keys", (2, 3, 4), (2, 6, 4), (2, 6, 2), dict(is_causal=True, scale=1.5)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,qs,ks,vs,kw", ATTENTION, ids=[a[0] for a in ATTENTION])
def test_attention(dtype, name, qs, ks, vs, kw):
    _compare(*_sdpa(**kw), [rand(*qs, scale=2), rand(*ks, seed=1), rand(*vs, seed=2)], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mshape", [(4, 6), (3, 1, 6), (2, 3, 4, 6), (1, 6), (1, 4, 1)])
def test_attention_bool_mask_with_fully_masked_queries(dtype, mshape):
    """True: the key takes part. A query whose row is all False gets an output of 0 (and no
    gradient through it), as torch 2.13's."""
    mask = np.random.default_rng(5).random(mshape) > 0.4
    if len(mshape) >= 2 and mshape[-2] > 1:
        mask[..., 1, :] = False  # a query that sees nothing
    args = [rand(2, 3, 4, 5), rand(2, 3, 6, 5, seed=1), rand(2, 3, 6, 2, seed=2), mask]
    got = _compare(*_sdpa(), args, dtype)[0]
    if len(mshape) >= 2 and mshape[-2] > 1:
        assert np.all(got[..., 1, :] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_float_mask_added_with_minus_inf_rows(dtype):
    """A float mask is added to the scores (and differentiated); -inf excludes a key, a row of
    -inf alone gives 0 as torch 2.13's; a large finite negative row still averages."""
    mask = rand(3, 4, 6, seed=4)
    mask[0, 2, [1, 4]] = -np.inf
    mask[1, 0, :] = -np.inf
    mask[2, 3, :] = -1e30
    args = [rand(2, 3, 4, 5), rand(2, 3, 6, 5, seed=1), rand(2, 3, 6, 2, seed=2), mask]
    got = _compare(*_sdpa(), args, dtype, tol=TOL[dtype] * (1 if dtype == "float64" else 5))[0]
    assert np.all(got[:, 1, 0, :] == 0) and np.isfinite(got).all()


def test_compiled_attention_with_masked_queries_matches_torch():
    """The compiled kernels (forward and gradients) give torch's values too: -inf scores and a
    query that sees no key (0, not NaN) included."""
    q, k, v = (tg.placeholder(s, dtype="float32", name=n) for s, n in (((2, 4, 3), "q"), ((2, 5, 3), "k"),
                                                                         ((2, 5, 2), "v")))
    fmask, bmask = tg.placeholder((4, 5), dtype="float32", name="fm"), tg.placeholder((4, 5), dtype="bool", name="bm")
    outs = [nn.scaled_dot_product_attention(q, k, v, attn_mask=fmask),
            nn.scaled_dot_product_attention(q, k, v, attn_mask=bmask)]
    heads = [tg.placeholder(o.shape, dtype="float32", name=f"h{t}") for t, o in enumerate(outs)]
    grads = [list(tg.differentiate(o, [q, k, v], head=h)) for o, h in zip(outs, heads)]
    kernel = tg.build(outs + grads[0] + grads[1], [q, k, v, fmask, bmask] + heads)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in (q, k, v, fmask)]
    arrays[3][2, :] = -np.inf
    arrays[3][0, 1:3] = -np.inf
    bm = rng.random((4, 5)) > 0.5
    bm[1, :] = False
    hs = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
    got = kernel(*arrays, bm, *hs)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
    for t, mask in enumerate((torch.tensor(arrays[3]), torch.tensor(bm))):
        want = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
        want_g = torch.autograd.grad((want * torch.tensor(hs[t])).sum(), [tq, tk, tv])
        np.testing.assert_allclose(got[t], want.detach().numpy(), rtol=1e-5, atol=1e-5)
        for g, w in zip(got[2 + 3 * t:5 + 3 * t], want_g):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)
    assert np.all(got[0][:, 2] == 0) and np.all(got[1][:, 1] == 0)


def test_attention_plus_inf_in_a_float_mask_gives_nan_as_torch():
    mask = np.zeros((2, 3))
    mask[1, 2] = np.inf
    got = _compare(*_sdpa(), [rand(1, 2, 4), rand(1, 3, 4, seed=1), rand(1, 3, 2, seed=2), mask], "float64",
                   grad=False)[0]
    assert np.isnan(got[0, 1]).all() and np.isfinite(got[0, 0]).all()


def test_causal_attention_is_an_index_condition_not_a_mask_tensor():
    q = tg.placeholder((2, 4, 3), dtype="float64", name="q")
    out = nn.scaled_dot_product_attention(q, q, q, is_causal=True)
    inputs = [t for t in tg.graph.topo_order([out]) if t.is_placeholder]
    assert inputs == [q]


# ----- a symbolic batch --------------------------------------------------------------------------

SYMBOLIC = [
    ("gelu_tanh", lambda x: nn.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh"), [(3,)]),
    ("silu", nn.silu, F.silu, [(3,)]),
    ("swiglu", nn.swiglu, lambda g, u: F.silu(g) * u, [(3,), (3,)]),
    ("rms_norm", lambda x, w: nn.rms_norm(x, w), lambda x, w: F.rms_norm(x, (4,), w), [(4,), None]),
    ("conv1d", lambda x, w: nn.conv1d(x, w, padding="same"), lambda x, w: F.conv1d(x, w, padding="same"),
     [(2, 6), None]),
    ("chunk", lambda x: nn.chunk(x, 2, axis=1)[1], lambda x: torch.chunk(x, 2, dim=1)[1], [(5,)]),
    ("attention_causal", lambda q, k, v: nn.scaled_dot_product_attention(q, k, v, is_causal=True),
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 3, 4), (2, 3, 4), (2, 3, 2)]),
]
FIXED = {"rms_norm": [(4,)], "conv1d": [(3, 2, 3)]}


@pytest.mark.parametrize("name,fn,tfn,shapes", SYMBOLIC, ids=[s[0] for s in SYMBOLIC])
def test_symbolic_batch_matches_torch(name, fn, tfn, shapes):
    """Shapes (n, ...) with n a tg.var: values and gradients at two batch sizes, and one kernel."""
    n = tg.var("n", min=1)
    fixed = iter(FIXED.get(name, []))
    full = [(n,) + s if s is not None else next(fixed) for s in shapes]
    ins = [tg.placeholder(s, dtype="float64", name=f"a{k}") for k, s in enumerate(full)]
    out = fn(*ins)
    head = tg.placeholder(out.shape, dtype="float64", name="head")
    grads = list(tg.differentiate(out, ins, head=head))
    kernel = tg.build([out] + grads, ins + [head])
    for b in (2, 3):
        rng = np.random.default_rng(b)
        arrays = [rng.standard_normal(tuple(b if not isinstance(d, int) else d for d in s)) for s in full]
        tens = [torch.tensor(a, requires_grad=True) for a in arrays]
        want = tfn(*tens)
        h = rng.standard_normal(tuple(want.shape))
        want_g = torch.autograd.grad((want * torch.tensor(h)).sum(), tens)
        got = tg.evaluate([out] + grads, {**dict(zip(ins, arrays)), head: h}, sizes={n: b})
        ran = kernel(*arrays, h)
        for g, r, w in zip(got, ran, [want.detach()] + list(want_g)):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-9, atol=1e-10)
            np.testing.assert_allclose(r, w.numpy(), rtol=1e-9, atol=1e-10)


# ----- bad input ---------------------------------------------------------------------------------

def _ph(*shape, dtype="float64", name="X"):
    return tg.placeholder(shape, dtype=dtype, name=name)


Q, K, V = _ph(2, 4, 5, name="Q"), _ph(2, 6, 5, name="K"), _ph(2, 6, 3, name="V")
ERRORS = [
    (lambda: nn.gelu(_ph(3), approximate="fast"), "gelu: approximate must be 'none' or 'tanh', got 'fast'"),
    (lambda: nn.gelu(_ph(3), approximate=None), "gelu: approximate must be 'none' or 'tanh', got None"),
    (lambda: nn.silu(_ph(3, dtype="int64")), "silu: input X must have a float dtype"),
    (lambda: nn.swiglu(_ph(3, 4, name="G"), _ph(4, 3, name="U")), r"swiglu: gate G float64\(3, 4\) and up U"),
    (lambda: nn.swiglu(_ph(3, name="G"), _ph(3, dtype="float32", name="U")), "must have the same shape and dtype"),
    (lambda: nn.rms_norm(_ph(3, 4), eps=-1.0), "rms_norm: eps must be a non-negative number, got -1.0"),
    (lambda: nn.rms_norm(_ph(3, 4), _ph(3, name="W")), r"rms_norm: weight W has shape \[3\] but \[4\] is needed"),
    (lambda: nn.rms_norm(_ph(3, 4), axis=0), "rms_norm: axis 0 must name distinct trailing axes"),
    (lambda: nn.rms_norm(_ph(), axis=-1), "rms_norm: input X is 0-d"),
    (lambda: nn.conv1d(_ph(1, 2, 5), _ph(3, 2, 2, name="W"), padding="full"),
     "conv1d: padding must be an int, a 1-tuple, 'same' or 'valid', got 'full'"),
    (lambda: nn.conv1d(_ph(1, 2, 5), _ph(3, 2, 2, name="W"), padding=(1, 2)), r"conv1d: padding .* got \(1, 2\)"),
    (lambda: nn.conv1d(_ph(1, 2, 5), _ph(3, 2, 2, name="W"), padding=-1), "conv1d: padding .* got -1"),
    (lambda: nn.conv1d(_ph(1, 2, 5), _ph(3, 2, 2, name="W"), padding="same", stride=2),
     "conv1d: padding='same' needs stride 1, got stride 2"),
    (lambda: nn.conv1d(_ph(1, 2, 5), _ph(3, 2, 2, name="W"), stride=0), "conv1d: stride must be >= 1"),
    (lambda: nn.conv1d(_ph(1, 2, 5, 5), _ph(3, 2, 2, name="W")), "conv1d: input X must be 3-D"),
    (lambda: nn.conv1d(_ph(1, 4, 5), _ph(3, 2, 2, name="W"), groups=2),
     "conv1d: groups=2 does not divide the 3 output"),
    (lambda: nn.conv1d(_ph(1, 2, 5), _ph(3, 1, 2, name="W")), "conv1d: channel mismatch"),
    (lambda: nn.conv1d(_ph(1, 2, 3), _ph(3, 2, 3, name="W"), dilation=2), "conv1d: the dilated kernel 5 is larger"),
    (lambda: nn.conv1d(_ph(1, 2, 5), _ph(3, 2, 2, name="W"), _ph(2, name="b")), "conv1d: bias b has length 2"),
    (lambda: nn.chunk(_ph(4, 3), 0), "chunk: chunks must be a positive int, got 0"),
    (lambda: nn.chunk(_ph(4, 3), 2.0), "chunk: chunks must be a positive int, got 2.0"),
    (lambda: nn.chunk(_ph(4, 3), 2, axis=2), "chunk: axis 2 is out of range"),
    (lambda: nn.chunk(_ph(0, 3), 2), "chunk: axis 0 of X is empty"),
    (lambda: nn.chunk(_ph(tg.var("n"), 3), 2), "chunk: axis 0 of X has the size n, known only at run time"),
    (lambda: nn.split(_ph(5, 3), sizes=[2, 2]), r"split: sizes must be non-negative ints summing to the size 5"),
    (lambda: nn.split(_ph(5, 3), sizes=0), "split: the part length sizes must be a positive int, got 0"),
    (lambda: nn.split(_ph(5, 3), 5, sizes=1), "split: give indices_or_sections .* not both"),
    (lambda: nn.split(_ph(5, 3)), r"split: give indices_or_sections \(numpy.split\) or sizes \(torch.split\)"),
    (lambda: nn.split(_ph(tg.var("n"), 3), sizes=2), "split: axis 0 of X has the size n, known only at run time"),
    (lambda: nn.scaled_dot_product_attention(Q, K, V, dropout_p=0.1),
     "scaled_dot_product_attention: dropout_p must be 0 .* got 0.1"),
    (lambda: nn.scaled_dot_product_attention(Q, K, V, attn_mask=_ph(4, 6, dtype="bool", name="M"), is_causal=True),
     "scaled_dot_product_attention: attn_mask must be None when is_causal=True"),
    (lambda: nn.scaled_dot_product_attention(Q, K, V, attn_mask=_ph(4, 5, dtype="bool", name="M")),
     r"scaled_dot_product_attention: attn_mask M \(4, 5\) does not broadcast to the scores' shape \(2, 4, 6\)"),
    (lambda: nn.scaled_dot_product_attention(Q, K, V, attn_mask=_ph(3, 2, 4, 6, name="M")),
     "attn_mask M .* does not broadcast"),
    (lambda: nn.scaled_dot_product_attention(Q, K, V, attn_mask=_ph(4, 6, dtype="int64", name="M")),
     "scaled_dot_product_attention: attn_mask M must be bool or float64 like the query, got int64"),
    (lambda: nn.scaled_dot_product_attention(Q, _ph(2, 6, 4, name="K"), V),
     "scaled_dot_product_attention: query Q has 5 features but key K has 4"),
    (lambda: nn.scaled_dot_product_attention(Q, K, _ph(2, 5, 3, name="V")),
     "scaled_dot_product_attention: key K has 6 positions but value V has 5"),
    (lambda: nn.scaled_dot_product_attention(Q, _ph(3, 6, 5, name="K"), V),
     "scaled_dot_product_attention: .* must have the same leading"),
    (lambda: nn.scaled_dot_product_attention(_ph(5, name="Q"), K, V),
     "scaled_dot_product_attention: query Q must have at least 2 axes"),
    (lambda: nn.scaled_dot_product_attention(Q, K, _ph(2, 6, 3, dtype="float32", name="V")),
     "scaled_dot_product_attention: query Q, key K and value V must have one dtype"),
    (lambda: nn.scaled_dot_product_attention(Q, K, V, scale=float("nan")),
     "scaled_dot_product_attention: scale must be a finite number or None, got nan"),
    (lambda: nn.scaled_dot_product_attention(Q, K, V, is_causal=1), "is_causal must be True or False, got 1"),
]


@pytest.mark.parametrize("build,message", ERRORS, ids=[str(k) for k in range(len(ERRORS))])
def test_bad_input_is_a_user_error(build, message):
    with pytest.raises(UserError, match=message):
        build()
