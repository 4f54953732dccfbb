"""Training steps of PyTorch models imported with ``te_grad.torch.import_model``, against PyTorch.

    python benchmarks/import_models.py [--models resnet18 resnet_small gpt2 lstm encoder segnet] [--threads 1 2] [--steps 20]

For each model and thread count, in a process of its own (``torch.set_num_threads`` and the
Trainer's ``threads`` equal), from the same weights and batches:

- ``te_grad``: ``import_model`` + ``train.Trainer`` (SGD with momentum 0.9), one native call
  per step;
- ``eager``: the module in PyTorch eager mode, ``F.cross_entropy``, ``backward``,
  ``torch.optim.SGD``;
- ``compile``: the same with ``torch.compile(module)`` (inductor), compile time excluded
  (warm-up steps first).

Printed: median ms per step of each, the ratios te_grad / eager and te_grad / compile, the
first losses of te_grad and eager (they agree: the same model, weights and batches), and
te_grad's build time cold (a fresh disk cache: import, graphs, isl, LLVM) and warm (a new
process on the cache the cold one filled).

Models (random init, no download): ``resnet18`` (torchvision's architecture, width 64,
CIFAR-sized 3x32x32 input, 10 classes, batch 32), ``resnet_small`` (a 3x3 stem and 3 residual
blocks of two 3x3 convolutions with batch norm and relu, 32 channels at 32x32, batch 32), ``gpt2`` (one GPT-2 block: d_model 128,
4 heads, seq 64, causal ``scaled_dot_product_attention``, tanh GELU, LM head over 512
tokens, batch 16), ``segnet`` (per-pixel classes: two 3x3 convolutions with max pooling, then
two bilinear upsamplings by 2 each followed by a 3x3 convolution, 32 channels at 32x32, batch
16), ``lstm`` (``nn.LSTM`` 32 -> 128 over 16 steps, a linear head to 10
classes, batch 32), ``encoder`` (a 2-block ``nn.TransformerEncoder``: d_model 128, 4 heads,
feed-forward 512 with exact GELU, sequence 64, batch 16, a mean over the sequence and a
linear head to 10 classes).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet18(nn.Module):
        def __init__(self, width=64, classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            layers, cin = [], width
            for k, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
                stride = 1 if k == 0 else 2
                layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
                cin = cout
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    class SmallResNet(nn.Module):
        """The small ResNet of the "fast on whole models" measure: a 3x3 stem, 3 residual blocks
        of two 3x3 convolutions with batch norm and relu, 32 channels at 32x32, a linear head."""
        def __init__(self, width=32, classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.blocks = nn.Sequential(*[BasicBlock(width, width, 1) for _ in range(3)])
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(width, classes)

        def forward(self, x):
            x = self.blocks(F.relu(self.bn1(self.conv1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    class GPT2Block(nn.Module):
        def __init__(self, vocab=512, d=128, heads=4, seq=64):
            super().__init__()
            self.heads = heads
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.ln_1, self.ln_2, self.ln_f = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.lm_head = nn.Linear(d, vocab, bias=False)

        def forward(self, ids):
            b, t = ids.shape
            pos = torch.arange(t, device=ids.device)
            x = self.wte(ids) + self.wpe(pos)
            q, k, v = self.c_attn(self.ln_1(x)).split(x.shape[-1], dim=2)
            hd = x.shape[-1] // self.heads
            q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
            x = x + self.c_proj(y)
            x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return self.lm_head(self.ln_f(x))

    class LSTMClassifier(nn.Module):
        def __init__(self, d_in=32, hidden=128, classes=10):
            super().__init__()
            self.lstm = nn.LSTM(d_in, hidden, batch_first=True)
            self.head = nn.Linear(hidden, classes)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.head(out[:, -1])

    class Encoder(nn.Module):
        """The 2-block transformer encoder of the "fast on whole models" measure, as a PyTorch
        user writes it: nn.TransformerEncoder, d_model 128, 4 heads, feed-forward 512 with exact
        GELU, post-norm layer norms, a mean over the sequence and a linear head."""
        def __init__(self, d=128, heads=4, ff=512, classes=10):
            super().__init__()
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(d, classes)

        def forward(self, x):
            return self.head(self.encoder(x).mean(1))

    class SegNet(nn.Module):
        """A small encoder-decoder for per-pixel classes: two 3x3 convolutions each followed by
        2x2 max pooling, a 3x3 convolution, two bilinear upsamplings by 2 (corners not aligned)
        each followed by a 3x3 convolution, 10 class logits per pixel as (batch, pixels, 10)."""
        def __init__(self, width=32, classes=10):
            super().__init__()
            self.down1 = nn.Conv2d(3, width, 3, padding=1)
            self.down2 = nn.Conv2d(width, 2 * width, 3, padding=1)
            self.mid = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
            self.up1 = nn.Conv2d(2 * width, width, 3, padding=1)
            self.up2 = nn.Conv2d(width, classes, 3, padding=1)

        def forward(self, x):
            h = F.max_pool2d(F.relu(self.down1(x)), 2)
            h = F.max_pool2d(F.relu(self.down2(h)), 2)
            h = F.relu(self.mid(h))
            h = F.relu(self.up1(F.interpolate(h, scale_factor=2, mode="bilinear")))
            h = self.up2(F.interpolate(h, scale_factor=2, mode="bilinear"))
            return h.permute(0, 2, 3, 1).reshape(h.shape[0], -1, h.shape[1])

    g = torch.Generator().manual_seed(0)
    return {
        "segnet": (lambda: SegNet(), lambda b: (torch.randn(b, 3, 32, 32, generator=g),),
                   lambda b: torch.randint(0, 10, (b, 32 * 32), generator=g), 16),
        "encoder": (lambda: Encoder(), lambda b: (torch.randn(b, 64, 128, generator=g),),
                    lambda b: torch.randint(0, 10, (b,), generator=g), 16),
        "resnet_small": (lambda: SmallResNet(), lambda b: (torch.randn(b, 3, 32, 32, generator=g),),
                         lambda b: torch.randint(0, 10, (b,), generator=g), 32),
        "resnet18": (lambda: ResNet18(), lambda b: (torch.randn(b, 3, 32, 32, generator=g),),
                     lambda b: torch.randint(0, 10, (b,), generator=g), 32),
        "gpt2": (lambda: GPT2Block(), lambda b: (torch.randint(0, 512, (b, 64), generator=g),),
                 lambda b: torch.randint(0, 512, (b, 64), generator=g), 16),
        "lstm": (lambda: LSTMClassifier(), lambda b: (torch.randn(b, 16, 32, generator=g),),
                 lambda b: torch.randint(0, 10, (b,), generator=g), 32),
    }


def child(name, threads, steps, warm_only):
    import torch
    import torch.nn.functional as F

    import te_grad as tg
    import te_grad.torch as tgt
    from te_grad import train

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    make, inputs, labels, batch = models()[name]
    net = make()
    xs = [inputs(batch) for _ in range(steps + 3)]
    ys = [labels(batch) for _ in range(steps + 3)]
    out = {}
    t0 = time.perf_counter()
    model = tgt.import_model(net, xs[0])
    xp = model.input_placeholders()
    yp = tg.placeholder(tuple(ys[0].shape), dtype="int64", name="y")

    def loss(out, y):  # a sequence model's logits (b, t, vocab) against labels (b, t)
        if out.ndim == 3:
            out, y = tg.nn.reshape(out, (-1, out.shape[-1])), tg.nn.reshape(y, (-1,))
        return tg.nn.softmax_cross_entropy(out, y)
    trainer = train.Trainer(model, inputs=xp, targets=[yp], loss=loss,
                            optimizer=train.SGD(lr=0.01, momentum=0.9), threads=threads, progress=False)
    trainer.compile()
    out["build_s"] = time.perf_counter() - t0
    if warm_only:
        return out
    times, losses = [], []
    for k in range(steps + 3):
        args = [x.numpy() for x in xs[k]] + [ys[k].numpy()]
        t1 = time.perf_counter()
        losses.append(trainer.update(*args))
        times.append(time.perf_counter() - t1)
    out["te_grad_ms"] = float(np.median(times[3:]) * 1e3)
    out["te_grad_losses"] = [float(v) for v in losses[:3]]

    def torch_run(module, n):
        opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
        ts, ls = [], []
        for k in range(n):
            t1 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            logits = module(*xs[k % len(xs)])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys[k % len(ys)].reshape(-1))
            loss.backward()
            opt.step()
            ts.append(time.perf_counter() - t1)
            ls.append(float(loss))
        return ts, ls

    eager = make()
    eager.load_state_dict(net.state_dict())
    ts, ls = torch_run(eager, steps + 3)
    out["eager_ms"] = float(np.median(ts[3:]) * 1e3)
    out["eager_losses"] = ls[:3]
    try:
        comp = make()
        comp.load_state_dict(net.state_dict())
        compiled = torch.compile(comp)
        ts, _ = torch_run(compiled, steps + 5)
        out["compile_ms"] = float(np.median(ts[5:]) * 1e3)
    except Exception as e:  # noqa: BLE001 - inductor needs a C++ compiler
        out["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet_small", "gpt2", "lstm", "encoder", "segnet"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        name, threads, warm = args.child
        print(json.dumps(child(name, int(threads), args.steps, warm == "1")))
        return
    print(f"{'model':10s} {'thr':>3s} {'te_grad ms':>10s} {'eager ms':>9s} {'compile ms':>10s} {'/eager':>7s} "
          f"{'/compile':>8s} {'cold s':>7s} {'warm s':>7s}  first losses (te_grad | eager)")
    for name in args.models:
        for threads in args.threads:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TE_GRAD_CACHE_DIR=cache, TE_GRAD_CACHE="1")
                runs = []
                for warm in ("0", "1"):
                    p = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--child", name,
                                        str(threads), warm], env=env, capture_output=True, text=True)
                    if p.returncode:
                        print(p.stderr[-3000:])
                        raise SystemExit(f"{name}: the child process failed")
                    runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
            r, w = runs
            comp = r.get("compile_ms")
            print(f"{name:10s} {threads:3d} {r['te_grad_ms']:10.2f} {r['eager_ms']:9.2f} "
                  f"{comp if comp is None else round(comp, 2)!s:>10s} {r['te_grad_ms'] / r['eager_ms']:7.2f} "
                  f"{'-' if comp is None else round(r['te_grad_ms'] / comp, 2)!s:>8s} {r['build_s']:7.2f} "
                  f"{w['build_s']:7.2f}  {np.round(r['te_grad_losses'], 4).tolist()} | "
                  f"{np.round(r['eager_losses'], 4).tolist()}")
            if "compile_error" in r:
                print(f"  torch.compile: {r['compile_error']}")


if __name__ == "__main__":
    main()
