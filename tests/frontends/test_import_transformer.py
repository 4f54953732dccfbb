"""``te_grad.torch.import_model`` on transformer, recurrent and loss-returning modules, checked
against PyTorch: GPT-2 and ViT blocks, ``nn.LSTM`` and a hand-written LSTM cell loop, and
modules returning ``F.cross_entropy`` / ``F.mse_loss`` (the Trainer's loss is then the identity).

The models follow their published architectures at a small width: GPT-2 (token and learned
position embeddings, pre-LN blocks with a fused ``c_attn``, causal attention both through
``F.scaled_dot_product_attention(is_causal=True)`` and written by hand with a ``tril`` mask
buffer, tanh GELU, dropout, final LayerNorm, an LM head tied to the embedding or not) and ViT
(a strided Conv2d patch embedding, a class token, position embeddings, exact GELU, attention
with a bool or float ``attn_mask``, the head on the class token).
"""
import copy
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tnn = torch.nn
F = torch.nn.functional

import te_grad as tg  # noqa: E402
import te_grad.torch as tgt  # noqa: E402
from te_grad import train  # noqa: E402
from te_grad.graph import topo_order  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


# -- the models ------------------------------------------------------------------------------------
class GPTBlock(tnn.Module):
    def __init__(self, d, heads, seq, p, manual):
        super().__init__()
        self.h, self.manual = heads, manual
        self.ln_1, self.c_attn, self.c_proj = tnn.LayerNorm(d), tnn.Linear(d, 3 * d), tnn.Linear(d, d)
        self.ln_2, self.c_fc, self.mlp_proj = tnn.LayerNorm(d), tnn.Linear(d, 4 * d), tnn.Linear(4 * d, d)
        self.attn_dropout, self.resid_dropout = tnn.Dropout(p), tnn.Dropout(p)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.h, C // self.h).transpose(1, 2) for z in (q, k, v))
        if self.manual:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = self.attn_dropout(F.softmax(att, dim=-1)) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.resid_dropout(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(tnn.Module):
    """Block 0 attends through sdpa, block 1 by hand."""

    def __init__(self, vocab=32, d=16, heads=2, seq=8, p=0.0, tied=True):
        super().__init__()
        self.wte, self.wpe, self.drop = tnn.Embedding(vocab, d), tnn.Embedding(seq, d), tnn.Dropout(p)
        self.h = tnn.ModuleList([GPTBlock(d, heads, seq, p, manual) for manual in (False, True)])
        self.ln_f, self.lm_head = tnn.LayerNorm(d), tnn.Linear(d, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class LMLoss(tnn.Module):
    """A language model returning its own next-token loss."""

    def __init__(self, lm, **kw):
        super().__init__()
        self.lm, self.kw = lm, kw

    def forward(self, idx, targets):
        logits = self.lm(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), **self.kw)


class ViTBlock(tnn.Module):
    def __init__(self, d, heads, mask):
        super().__init__()
        self.h = heads
        self.mask = mask   # None, bool or float: a constant of the exported program
        self.norm1, self.qkv, self.proj = tnn.LayerNorm(d), tnn.Linear(d, 3 * d), tnn.Linear(d, d)
        self.norm2, self.fc1, self.fc2 = tnn.LayerNorm(d), tnn.Linear(d, 2 * d), tnn.Linear(2 * d, d)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(B, N, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=self.mask)
        x = x + self.proj(y.transpose(1, 2).reshape(B, N, C))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(tnn.Module):
    def __init__(self, img=8, patch=4, ch=3, d=16, heads=2, classes=5, masks=(None,)):
        super().__init__()
        n = (img // patch) ** 2
        self.patch_embed = tnn.Conv2d(ch, d, patch, stride=patch)
        self.cls_token = tnn.Parameter(torch.randn(1, 1, d) * 0.5)
        self.pos_embed = tnn.Parameter(torch.randn(1, n + 1, d) * 0.5)
        self.blocks = tnn.ModuleList([ViTBlock(d, heads, m) for m in masks])
        self.norm, self.head = tnn.LayerNorm(d), tnn.Linear(d, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class LSTMNet(tnn.Module):
    def __init__(self, i=4, h=8, o=3):
        super().__init__()
        self.lstm, self.fc = tnn.LSTM(i, h, batch_first=True), tnn.Linear(h, o)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class CellLoop(tnn.Module):
    """An LSTM cell written by hand, its gates by ``chunk(4, dim=1)``."""

    def __init__(self, i=4, h=8, o=3):
        super().__init__()
        self.hidden = h
        self.wi, self.wh, self.fc = tnn.Linear(i, 4 * h), tnn.Linear(h, 4 * h), tnn.Linear(h, o)

    def forward(self, x):
        B, T, _ = x.shape
        h, c = x.new_zeros(B, self.hidden), x.new_zeros(B, self.hidden)
        for t in range(T):
            i, f, g, o = (self.wi(x[:, t]) + self.wh(h)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return self.fc(h)


class MSELoss(tnn.Module):
    def __init__(self, net, **kw):
        super().__init__()
        self.net, self.kw = net, kw

    def forward(self, x, y):
        return F.mse_loss(self.net(x), y, **self.kw)


class CELoss(tnn.Module):
    def __init__(self, net, **kw):
        super().__init__()
        self.net, self.kw = net, kw

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y, **self.kw)


# -- helpers ---------------------------------------------------------------------------------------
def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def np_of(xs):
    return [x.detach().numpy() for x in xs]


def identity_trainer(model, optimizer):
    """A Trainer whose model returns its loss: every input is a model input, no targets."""
    return train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=lambda out: out,
                         optimizer=optimizer, progress=False, dynamic_batch=model.dynamic_batch)


def mean_trainer(model):
    """A Trainer for :meth:`~te_grad.train.Trainer.predict` (the evaluation program) alone."""
    return train.Trainer(model, inputs=model.input_placeholders(), targets=[], loss=lambda out: tg.nn.mean(out),
                         optimizer=train.SGD(lr=0.1), progress=False)


def training_forward(model):
    """``run(arrays, seed)``: the te_grad training program's output on the model's starting
    weights, dropout drawn from ``seed`` (one native kernel)."""
    xs = model.input_placeholders()
    seed_ph = tg.placeholder((), dtype="int64", name="seed")
    out = model(*xs, train.Context(training=True, seed=seed_ph))
    feed = {id(p.placeholder): p.value for p in model.parameters()}
    feed.update({id(s.placeholder): np.asarray(s.initial, s.dtype) for s in model.states()})
    inputs = [t for t in topo_order([out]) if t.is_placeholder]
    kernel = tg.build([out], inputs)

    def run(arrays, seed=1):
        given = dict(feed)
        given.update(zip(map(id, xs), arrays))
        given[id(seed_ph)] = np.array(seed, np.int64)
        return kernel(*[given[id(t)] for t in inputs])
    return run


def torch_steps(net, batches, make_opt, steps):
    """PyTorch's losses over ``steps`` training steps of a loss-returning ``net`` (mutated)."""
    net.train()
    opt = make_opt(net.parameters())
    losses = []
    for k in range(steps):
        opt.zero_grad()
        loss = net(*batches[k % len(batches)])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_training(net, batches, make_opt, optimizer, steps=5, tol=1e-4, noise=None, dynamic_batch=True):
    """``steps`` steps of te_grad's Trainer and of PyTorch from the same weights: the same
    losses (the first one is the training-mode forward) and the same weights after.

    ``noise`` ({name: slice}) names parameter entries whose exact gradient is 0 and computed
    as rounding noise by both: Adam divides it by its own size into steps of about ``lr``
    in either direction, so they are left out of the comparison."""
    model = tgt.import_model(net, batches[0], dynamic_batch=dynamic_batch)
    trainer = identity_trainer(model, optimizer)
    ours = [trainer.update(*np_of(batches[k % len(batches)])) for k in range(steps)]
    reference = copy.deepcopy(net)
    theirs = torch_steps(reference, batches, make_opt, steps)
    assert abs(ours[0] - theirs[0]) <= 1e-5 * abs(theirs[0])
    assert rel(ours, theirs) < tol, (ours, theirs)
    state = reference.state_dict()
    for name, value in trainer.params.items():
        want = state[name].numpy()
        if noise and name in noise:
            keep = np.ones(want.shape, bool)
            keep[noise[name]] = False
            value, want = value[keep], want[keep]
        assert rel(value, want) < tol, name
    return model, trainer


# -- GPT-2 -----------------------------------------------------------------------------------------
def test_gpt2_tied_lm_loss_trains_as_pytorch_with_adam():
    torch.manual_seed(0)
    net = LMLoss(GPT(tied=True))
    batches = [(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))) for _ in range(2)]
    # a key's bias adds q . b_k to every score of a query: softmax ignores it, its gradient is 0
    key_bias = {f"lm.h.{k}.c_attn.bias": slice(16, 32) for k in range(2)}
    model, trainer = check_training(net, batches, lambda ps: torch.optim.Adam(ps, lr=1e-2),
                                    train.Adam(lr=1e-2), noise=key_bias, dynamic_batch=False)  # (quicker)
    # the tied head is one parameter, named as the embedding
    assert "lm.wte.weight" in trainer.params and "lm.lm_head.weight" not in trainer.params
    assert model.aliases["lm.lm_head.weight"] == "lm.wte.weight"


def test_gpt2_untied_float64_forward_and_dropout_semantics():
    torch.manual_seed(1)
    net = GPT(tied=False, p=0.1).double()
    idx = torch.randint(0, 32, (2, 8))
    model = tgt.import_model(net, (idx,))
    assert model.dynamic_batch and "lm_head.weight" in {p.name for p in model.parameters()}
    trainer = mean_trainer(model)
    net.eval()
    for batch in (2, 4):   # dropout is the identity in evaluation; one kernel for both batches
        x = torch.randint(0, 32, (batch, 8))
        assert rel(trainer.predict(x.numpy()), net(x).detach().numpy()) < 1e-12
    # training: dropout changes the output, another seed draws another mask
    eval_out = net(idx).detach().numpy()
    run = training_forward(model)
    a, b = run([idx.numpy()], 1), run([idx.numpy()], 2)
    assert np.all(np.isfinite(a)) and rel(a, eval_out) > 1e-3 and rel(a, b) > 1e-3
    # with p = 0 the training program is the evaluation one: PyTorch's training forward exactly
    for m in net.modules():
        if isinstance(m, tnn.Dropout):
            m.p = 0.0
    net.train()
    exact = tgt.import_model(net, (idx,), dynamic_batch=False)
    assert rel(training_forward(exact)([idx.numpy()]), net(idx).detach().numpy()) < 1e-12


class DropoutHead(tnn.Module):
    def __init__(self, p):
        super().__init__()
        self.emb, self.ln, self.drop = tnn.Embedding(32, 16, padding_idx=0), tnn.LayerNorm(16), tnn.Dropout(p)

    def forward(self, idx):
        return self.drop(self.ln(self.emb(idx)))


def test_dropout_in_training_zeroes_and_rescales_and_is_the_identity_in_evaluation():
    torch.manual_seed(2)
    p = 0.25
    net = DropoutHead(p)
    idx = torch.randint(1, 32, (4, 8))
    model = tgt.import_model(net, (idx,))
    net.eval()
    kept = net(idx).detach().numpy()
    trainer = mean_trainer(model)
    assert rel(trainer.predict(idx.numpy()), kept) < 1e-6       # evaluation: the identity
    masks, run = [], training_forward(model)
    for seed in (1, 2):
        out = run([idx.numpy()], seed)
        zero = out == 0
        np.testing.assert_allclose(out[~zero], kept[~zero] / (1 - p), rtol=1e-5, atol=1e-6)
        assert 0.15 < zero.mean() < 0.35, zero.mean()
        masks.append(zero)
    assert (masks[0] != masks[1]).any()


def test_embedding_padding_row_gets_no_gradient_as_in_pytorch():
    torch.manual_seed(3)
    net = MSELoss(tnn.Sequential(tnn.Embedding(10, 4, padding_idx=0), tnn.Flatten(), tnn.Linear(12, 2)))
    batches = [(torch.tensor([[0, 1, 2], [3, 0, 0], [4, 5, 0]]), torch.randn(3, 2))]
    _, trainer = check_training(net, batches, lambda ps: torch.optim.SGD(ps, lr=0.5), train.SGD(lr=0.5), steps=3)
    w = trainer.params["net.0.weight"]
    assert np.array_equal(w[0], net.net[0].weight.detach().numpy()[0])      # never updated
    assert not np.array_equal(w[1], net.net[0].weight.detach().numpy()[1])


# -- ViT -------------------------------------------------------------------------------------------
def test_vit_with_bool_and_float_masks_trains_as_pytorch_with_adamw_on_two_batch_sizes():
    torch.manual_seed(4)
    n = 5   # 4 patches and the class token
    bool_mask = torch.rand(n, n) > 0.3
    bool_mask[:, 0] = True                     # every query sees the class token
    net = ViT(masks=(bool_mask, torch.randn(n, n)))
    head = CELoss(net)
    batches = [(torch.randn(b, 3, 8, 8), torch.randint(0, 5, (b,))) for b in (2, 3)]
    key_bias = {f"net.blocks.{k}.qkv.bias": slice(16, 32) for k in range(2)}   # its gradient is 0 (see GPT-2)
    model, trainer = check_training(head, batches, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
                                    train.AdamW(lr=1e-2, weight_decay=0.1), noise=key_bias)
    assert len(trainer.kernels) == 1           # one step kernel served both batch sizes
    # the trained weights back into PyTorch, and the classifier alone: its logits in evaluation
    model.copy_to(head, trainer)
    vit = tgt.import_model(net, (batches[0][0],))
    net.eval()
    x = torch.randn(4, 3, 8, 8)
    ours = mean_trainer(vit).predict(x.numpy())
    assert rel(ours, net(x).detach().numpy()) < 1e-5


def test_vit_float64_forward():
    torch.manual_seed(5)
    net = ViT(masks=(None, torch.tril(torch.ones(5, 5, dtype=torch.bool)))).double().eval()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    trainer = mean_trainer(model)
    assert rel(trainer.predict(x.numpy()), net(x).detach().numpy()) < 1e-12


# -- nn.TransformerEncoder (nn.MultiheadAttention) ------------------------------------------------
class Encoder(tnn.Module):
    """PyTorch's own encoder layers, exact GELU, post-norm and pre-norm: its multi-head attention
    exports as projections through ``expand(weight)`` + ``bmm``."""
    def __init__(self, d=16, heads=2, ff=24, classes=3, norm_first=False):
        super().__init__()
        layer = tnn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True,
                                            norm_first=norm_first)
        self.encoder = tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = tnn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


class EncoderLoss(tnn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.net = Encoder(**kw)

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_forward_float64_and_sgd_steps(norm_first):
    """nn.TransformerEncoder imported: the evaluation forward equals PyTorch's in float64, 5 SGD
    steps give PyTorch's losses and weights in float32, and the attention projections read
    their weights directly (no gradient of an expanded weight summed over the batch)."""
    torch.manual_seed(6)
    net = Encoder(norm_first=norm_first).double().eval()
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    assert rel(mean_trainer(model).predict(x.numpy()), net(x).detach().numpy()) < 1e-12
    torch.manual_seed(7)
    loss_net = EncoderLoss(norm_first=norm_first)
    batches = [(torch.randn(3, 5, 16), torch.randint(0, 3, (3,))) for _ in range(2)]
    model, trainer = check_training(loss_net, batches, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                                    train.SGD(lr=0.05, momentum=0.9))
    xs = model.input_placeholders()
    out = model(*xs, train.Context(training=True, seed=tg.placeholder((), dtype="int64", name="seed")))
    # in_proj_weight, out_proj.weight, linear1.weight and linear2.weight of both layers, the head's
    weights = [p.placeholder for p in model.parameters() if len(p.shape) == 2]
    assert len(weights) == 9
    for g in tg.gradient(tg.nn.sum(out), weights):
        assert "expand" not in tg.show(g).splitlines()[-1] and "transpose" not in tg.show(g).splitlines()[-1]


class FlatRows(tnn.Module):
    """nn.MultiheadAttention's output projection: (batch, seq, heads, dim) to (seq, batch, ...),
    the rows flattened for the linear layer and viewed back; ``twice`` also reads the flat
    matrix elsewhere, which leaves the three nodes apart."""
    def __init__(self, twice=False):
        super().__init__()
        self.lin, self.twice = tnn.Linear(12, 5), twice

    def forward(self, x, y):
        s = x.transpose(0, 1)                                   # (seq, batch, 3, 4)
        flat = s.reshape(-1, 12)                                # (seq * batch, 12)
        z = self.lin(flat).view(s.shape[0], s.shape[1], 5).transpose(0, 1)
        out = z.mean(1) + (flat.sum() if self.twice else 0)
        return F.cross_entropy(out, y)


def test_a_linear_between_views_that_flatten_and_restore_rows_is_translated_whole():
    """The flattening view, the linear layer and the view back are translated as one linear over
    the leading axes (``translate.linear_folds``): the import keeps its batch size variable, where
    the flat row index ``s * batch + b`` is not affine in the sizes and the step had to be built per
    batch size, and the losses and weights of SGD steps on two batch sizes are PyTorch's."""
    from te_grad.frontends.translate import linear_folds
    from te_grad.torch_import import export_program
    torch.manual_seed(8)
    batches = [(torch.randn(b, 6, 3, 4), torch.randint(0, 5, (b,))) for b in (2, 3)]
    for twice in (False, True):
        ep, reason = export_program(FlatRows(twice), batches[0], training=True)
        assert reason is None
        assert len(linear_folds(list(ep.graph.nodes))) == (0 if twice else 1)
    model, trainer = check_training(FlatRows(), batches, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                    train.SGD(lr=0.1, momentum=0.9))
    assert model.dynamic_batch and len(trainer.kernels) == 1   # one step kernel for both batch sizes
    # the flat matrix read elsewhere too: no fold, the same values (at exact batch sizes)
    check_training(FlatRows(twice=True), batches[:1], lambda ps: torch.optim.SGD(ps, lr=0.1), train.SGD(lr=0.1),
                   dynamic_batch=False)


class VarArgs(tnn.Module):
    def __init__(self):
        super().__init__()
        self.lin = tnn.Linear(4, 3)

    def forward(self, *xs):
        return F.cross_entropy(self.lin(xs[0]) * xs[1], xs[2])


def test_a_forward_taking_star_args_keeps_its_batch_size_variable():
    """``forward(self, *xs)``: the batch's dynamic shapes are laid out as the signature takes the
    inputs (export refused a flat tuple there, and the batch silently became exact)."""
    torch.manual_seed(9)
    batches = [(torch.randn(b, 4), torch.randn(b, 3), torch.randint(0, 3, (b,))) for b in (2, 5)]
    model, trainer = check_training(VarArgs(), batches, lambda ps: torch.optim.SGD(ps, lr=0.1), train.SGD(lr=0.1))
    assert model.dynamic_batch and model.static_reason is None and len(trainer.kernels) == 1


class LinearCorners(tnn.Module):
    """``F.linear`` with a 1-D weight, a flat matrix that is the linear's input and its weight
    (``z @ z.T`` per row block: no fold), and a ``forward(self, x, *rest)`` given one input."""
    def __init__(self):
        super().__init__()
        self.w = tnn.Parameter(torch.randn(4))
        self.lin = tnn.Linear(4, 3)

    def forward(self, x, *rest):          # x (batch, 2, 4)
        z = x.reshape(-1, 4)
        zz = F.linear(z, z).view(x.shape[0], 2, -1)          # (batch, 2, 2 * batch)
        out = F.linear(x, self.w) + zz.sum(-1) + self.lin(x).mean(-1)
        return out.sum() + sum(r.sum() for r in rest)


def test_linear_with_a_vector_weight_a_flat_input_read_twice_and_empty_star_args():
    torch.manual_seed(10)
    batches = [(torch.randn(b, 2, 4),) for b in (2, 3)]
    model, trainer = check_training(LinearCorners(), batches, lambda ps: torch.optim.SGD(ps, lr=0.01),
                                    train.SGD(lr=0.01))
    assert model.dynamic_batch and model.static_reason is None and len(trainer.kernels) == 1


# -- LSTM ------------------------------------------------------------------------------------------
def test_nn_lstm_with_mse_sum_loss_trains_as_pytorch_with_sgd_momentum():
    torch.manual_seed(6)
    net = MSELoss(LSTMNet(), reduction="sum")
    batches = [(torch.randn(3, 8, 4), torch.randn(3, 3)) for _ in range(2)]
    # exact shapes: torch.export takes several times longer on an LSTM with a symbolic batch
    check_training(net, batches, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
                   train.SGD(lr=0.05, momentum=0.9), dynamic_batch=False)


def test_hand_written_lstm_cell_loop_forward_float64():
    torch.manual_seed(7)
    net = CellLoop().double()
    x = torch.randn(2, 8, 4, dtype=torch.float64)
    model = tgt.import_model(net, (x,))
    assert rel(training_forward(model)([x.numpy()]), net(x).detach().numpy()) < 1e-12


# -- losses inside the module ----------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(ignore_index=1), dict(reduction="sum")])
def test_cross_entropy_inside_the_module(kw):
    torch.manual_seed(8)
    net = CELoss(tnn.Sequential(tnn.Linear(6, 8), tnn.Tanh(), tnn.Linear(8, 4)), **kw)
    batches = [(torch.randn(5, 6), torch.tensor([0, 1, 2, 1, 3])), (torch.randn(4, 6), torch.tensor([3, 1, 1, 1]))]
    check_training(net, batches, lambda ps: torch.optim.Adam(ps, lr=1e-2), train.Adam(lr=1e-2))


# -- the rules of operators the export decomposes (a torch.compile graph may hold them whole) -----
def _rule(name, *args, **kwargs):
    from te_grad.frontends.aten import RULES
    from te_grad.frontends.translate import Translator
    return RULES[name](Translator(RULES), *args, **kwargs)


def _ours(name, arrays, *args, **kwargs):
    """The rule of ``name`` on placeholders of ``arrays``, computed by te_grad (every result)."""
    phs = [tg.placeholder(a.shape, dtype=str(a.dtype), name=f"a{k}") for k, a in enumerate(arrays)]
    out = _rule(name, *phs, *args, **kwargs)
    outs = list(out) if isinstance(out, tuple) else [out]
    return tg.evaluate(outs, dict(zip(phs, arrays)))


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_forward_and_mse_loss_rules_as_aten(reduction, weighted):
    rng = np.random.default_rng(reduction)
    x = rng.standard_normal((6, 4))
    y = np.array([0, 3, 2, -100, 1, 3])    # -100 (ignored) is out of the class range
    w = rng.random(4) + 0.5
    args = [x, y, w] if weighted else [x, y]
    ours = _ours("aten.nll_loss_forward.default", args, *([] if weighted else [None]), reduction, -100)
    theirs = torch.ops.aten.nll_loss_forward(torch.from_numpy(x), torch.from_numpy(y),
                                             torch.from_numpy(w) if weighted else None, reduction, -100)
    for a, b in zip(ours, theirs):
        assert rel(a, b.numpy()) < 1e-12
    t = rng.standard_normal((6, 4))
    ours = _ours("aten.mse_loss.default", [x, t], reduction)[0]
    assert rel(ours, torch.ops.aten.mse_loss(torch.from_numpy(x), torch.from_numpy(t), reduction).numpy()) < 1e-12


def test_gather_index_select_index_and_arange_rules_as_aten():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 2))
    tx = torch.from_numpy(x)
    xp = tg.placeholder(x.shape, dtype="float64", name="x")
    ix = rng.integers(0, 5, (3, 4, 2))
    ip = tg.placeholder(ix.shape, dtype="int64", name="ix")
    got = tg.evaluate([_rule("aten.gather.default", xp, 1, ip)], {xp: x, ip: ix})[0]
    assert rel(got, torch.gather(tx, 1, torch.from_numpy(ix)).numpy()) == 0
    ids = np.array([4, 0, 4])
    ip = tg.placeholder(ids.shape, dtype="int64", name="ids")
    got = tg.evaluate([_rule("aten.index_select.default", xp, 1, ip)], {xp: x, ip: ids})[0]
    assert rel(got, torch.index_select(tx, 1, torch.from_numpy(ids)).numpy()) == 0
    i2 = np.array([[1, 2], [0, 4]])
    ip = tg.placeholder(i2.shape, dtype="int64", name="i2")
    got = tg.evaluate([_rule("aten.index.Tensor", xp, [None, ip])], {xp: x, ip: i2})[0]
    assert rel(got, tx[:, torch.from_numpy(i2)].numpy()) == 0
    mask = x > 0.5
    mp, vp = tg.placeholder(mask.shape, dtype="bool", name="m"), tg.placeholder((), dtype="float64", name="v")
    got = tg.evaluate([_rule("aten.masked_fill.Tensor", xp, mp, vp)], {xp: x, mp: mask, vp: np.array(-2.0)})[0]
    assert rel(got, tx.masked_fill(torch.from_numpy(mask), torch.tensor(-2.0, dtype=torch.float64)).numpy()) == 0
    got = tg.evaluate([_rule("aten._to_copy.default", xp, dtype=torch.float32)], {xp: x})[0]
    assert got.dtype == np.float32 and np.array_equal(got, tx.float().numpy())
    for args, kw in (((2, 11, 3), {}), ((7,), {}), ((0.5, 2.0, 0.25), {}), ((1, 4), {"dtype": torch.float64})):
        got = tg.evaluate([_rule("aten.arange.start_step", *args, **kw)], {})[0]
        want = torch.arange(*args, **kw).numpy()
        assert got.dtype == want.dtype and np.array_equal(got, want), (args, got, want)
    with pytest.raises(tg.UserError, match="step"):
        _rule("aten.arange.start_step", 0, 4, 0)


class Norms(tnn.Module):
    """LayerNorm without bias, without affine parameters, and over the two trailing axes."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = tnn.LayerNorm(6, bias=False), tnn.LayerNorm(6, elementwise_affine=False), \
            tnn.LayerNorm((4, 6))

    def forward(self, x):
        return self.c(self.b(self.a(x)) * 2.0 + x)


def test_layer_norm_variants_forward():
    torch.manual_seed(9)
    net = Norms()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    net = net.double()
    model = tgt.import_model(net, (x,))
    xp = model.input_placeholders()[0]
    out = model(xp, train.Context(training=False))
    feed = {p.placeholder: p.value for p in model.parameters()}
    feed[xp] = x.numpy()
    assert rel(tg.evaluate([out], feed)[0], net(x).detach().numpy()) < 1e-12


class DropoutAttention(tnn.Module):
    def forward(self, q):
        return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1 if self.training else 0.0)


class PlainAttention(tnn.Module):
    def forward(self, q):
        return F.scaled_dot_product_attention(q, q, q)


def test_attention_dropout_in_training_is_refused_by_name_at_import():
    """The training program's attention dropout is refused when the model is imported (never
    a model that fails later, at its first training step); without it the same attention
    imports and evaluates as PyTorch's."""
    q = torch.randn(2, 2, 8, 4)
    with pytest.raises(tg.UserError, match="dropout_p=0.1 in training") as info:
        tgt.import_model(DropoutAttention(), (q,))
    assert "aten.scaled_dot_product_attention" in str(info.value) and "test_import_transformer.py" in str(info.value)
    model = tgt.import_model(PlainAttention(), (q,))
    xp = model.input_placeholders()[0]
    out = model(xp, train.Context(training=False))
    want = F.scaled_dot_product_attention(q, q, q).numpy()
    assert rel(tg.evaluate([out], {xp: q.numpy()})[0], want) < 1e-6
    x4 = tg.placeholder((2, 3), name="x4")
    with pytest.raises(tg.UserError, match="negative padding"):  # a crop
        _rule("aten.constant_pad_nd.default", x4, [1, -1])
    with pytest.raises(tg.UserError, match="int pairs for at most 2 axes"):
        _rule("aten.constant_pad_nd.default", x4, [1, 1, 1])
    padded = _rule("aten.constant_pad_nd.default", x4, [2, 1], 0.5)
    a4 = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(tg.evaluate([padded], {x4: a4})[0],
                                  F.pad(torch.from_numpy(a4), [2, 1], value=0.5).numpy())
    with pytest.raises(tg.UserError, match="scale_grad_by_freq"):
        _rule("aten.embedding.default", tg.placeholder((4, 2), name="w"), tg.placeholder((3,), "int64", name="i"),
              -1, True)


def evaluation_forward(model, arrays):
    """The te_grad evaluation program's output on the model's starting weights (numpy evaluator)."""
    xs = model.input_placeholders()
    out = model(*xs, train.Context(training=False))
    feed = {p.placeholder: p.value for p in model.parameters()}
    feed.update({s.placeholder: np.asarray(s.initial, s.dtype) for s in model.states()})
    feed.update(zip(xs, arrays))
    return tg.evaluate([out], feed)[0]


def test_nn_lstm_float64_and_gpt2_float32_evaluation_forward():
    torch.manual_seed(10)
    net = LSTMNet().double().eval()
    x = torch.randn(2, 8, 4, dtype=torch.float64)
    model = tgt.import_model(net, (x,), dynamic_batch=False)
    assert rel(evaluation_forward(model, [x.numpy()]), net(x).detach().numpy()) < 1e-12
    net = GPT(tied=True, p=0.1).eval()
    idx = torch.randint(0, 32, (2, 8))
    assert rel(evaluation_forward(tgt.import_model(net, (idx,)), [idx.numpy()]), net(idx).detach().numpy()) < 1e-5
