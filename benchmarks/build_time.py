"""Cold build times and code sizes of models and of ops written in ways that once blew up.

    python benchmarks/build_time.py [--repeat 3] [--cases NAME ...] [--warm]

Each case is built in a process of its own with the disk cache off (``TE_GRAD_CACHE=0``),
after one small warm-up build there (so the compile worker and the thread team already
run, as in any process that has built something); the time is the fastest of
``--repeat`` such processes, from ``tg.gradient`` (where there is one) to a kernel whose
machine code is ready. Printed per case: seconds, stages, lines of ``kern.loops``,
kilobytes of the optimized LLVM module (``kern.llvm_ir``) and its functions.

- ``digits_step``: the digits CNN's training step (forward, loss, gradients, Adam) for
  batches of 64 and the ragged last batch of 30, both compiled (``Trainer.compile``), as
  ``python -m te_grad train-digits`` reports it;
- ``resize_64_100`` / ``resize_32_100``: a bilinear resize with exact integer coordinates
  (``//`` and ``%``, the last row and column clamped), forward and input gradient;
- ``stencil_16``: 16 unrolled steps of a 5-point Jacobi stencil on 256 x 256, forward and
  gradient with respect to the initial grid;
- ``conv_s2_pad_stage``: a stride-2 convolution over a separate zero-padding stage,
  forward and both gradients;
- ``encoder_step``: a 2-layer PyTorch ``nn.TransformerEncoder`` (d_model 64, 4 heads, feed
  forward 128, sequence 32, batch 8, a linear head to 10 classes) imported with
  ``te_grad.torch.import_model`` and compiled as a training step (SGD with momentum), the
  import included;
- ``resnet18_step``: the same for ResNet-18 of :mod:`import_models` (width 64, 3x32x32
  input, batch 32).

``--warm`` builds each case twice, in two processes on one fresh disk cache (the cache on):
the first process fills it (cold), the second builds from it (warm).
"""
import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("TE_GRAD_CACHE", "0")  # --warm runs its cases with the cache on

import numpy as np  # noqa: E402

import te_grad as tg  # noqa: E402
from te_grad import nn, train  # noqa: E402
from te_grad.formulations import jacobi_steps, resize_exact  # noqa: E402
from te_grad.train import digits  # noqa: E402


def with_gradient(y, xs):
    h = tg.placeholder(y.shape, name="head")
    return [y] + list(tg.gradient(y, xs, head=h)), xs + [h]


def case_resize(size, out):
    def build():
        x = tg.placeholder((1, 8, size, size), name="X")
        outs, ins = with_gradient(resize_exact(x, out, out), [x])
        return [tg.build(outs, ins)]
    return build


def case_stencil():
    u = tg.placeholder((256, 256), name="U")
    outs, ins = with_gradient(jacobi_steps(u, 16), [u])
    return [tg.build(outs, ins)]


def case_conv_pad_stage():
    x, w = tg.placeholder((4, 32, 32, 32), name="X"), tg.placeholder((32, 32, 3, 3), name="W")
    p = tg.compute((4, 32, 34, 34), lambda b, c, y, v: tg.if_then_else(
        (y >= 1) & (y < 33) & (v >= 1) & (v < 33), x[b, c, y - 1, v - 1], 0.0), name="P")
    rc, ry, rx = tg.reduce_axis(32, "c"), tg.reduce_axis(3, "ry"), tg.reduce_axis(3, "rx")
    y = tg.compute((4, 32, 16, 16), lambda b, o, i, j: tg.sum(p[b, rc, 2 * i + ry, 2 * j + rx] * w[o, rc, ry, rx],
                                                            axis=[rc, ry, rx]), name="Y")
    outs, ins = with_gradient(y, [x, w])
    return [tg.build(outs, ins)]


def case_digits():
    x = tg.placeholder((64, 1, 8, 8), name="x")
    y = tg.placeholder((64,), dtype="int64", name="y")
    trainer = train.Trainer(digits.model(), inputs=[x], targets=[y], loss=nn.softmax_cross_entropy,
                            optimizer=train.Adam(lr=1e-2), init=train.xavier_uniform(seed=0), threads=1,
                            progress=False)
    trainer.compile(64, 1438 % 64)
    return trainer.kernels


def _imported_step(make, x, classes):
    import torch
    import te_grad.torch as tgt
    torch.manual_seed(0)
    net = make()
    model = tgt.import_model(net, (x,))
    y = tg.placeholder((x.shape[0],), dtype="int64", name="y")
    trainer = train.Trainer(model, inputs=model.input_placeholders(), targets=[y], loss=nn.softmax_cross_entropy,
                            optimizer=train.SGD(lr=0.01, momentum=0.9), threads=1, progress=False)
    trainer.compile()
    return trainer.kernels


def case_encoder():
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.head(self.encoder(x).mean(1))
    return _imported_step(Encoder, torch.randn(8, 32, 64), 10)


def case_resnet18():
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from import_models import models
    return _imported_step(models()["resnet18"][0], torch.randn(32, 3, 32, 32), 10)


CASES = {
    "digits_step": case_digits,
    "resize_64_100": case_resize(64, 100),
    "resize_32_100": case_resize(32, 100),
    "stencil_16": case_stencil,
    "conv_s2_pad_stage": case_conv_pad_stage,
    "encoder_step": case_encoder,
    "resnet18_step": case_resnet18,
}


def measure(name: str) -> str:
    """Build one case here (this process is fresh) and return its result line."""
    warm = tg.placeholder((8,), name="w")
    tg.build([tg.compute((8,), lambda i: warm[i] * 2.0, name="warm")], [warm], threads=2)(np.ones(8, np.float32))
    t0 = time.perf_counter()
    kernels = CASES[name]()
    for k in kernels:
        k.wait()
    seconds = time.perf_counter() - t0
    text = [k.llvm_ir for k in kernels]
    return (f"{seconds} {sum(len(k.stages) for k in kernels)} {sum(len(k.loops.splitlines()) for k in kernels)} "
            f"{sum(map(len, text)) / 1024:.0f} {sum(t.count('define ') for t in text)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per case; the fastest is reported")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), help="the cases to run (default: all)")
    parser.add_argument("--warm", action="store_true",
                        help="cold and warm builds on one fresh disk cache, per case (see above)")
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)  # one measurement, in this process
    args = parser.parse_args(argv)
    if args.case:
        print(measure(args.case))
        return
    if args.warm:
        import tempfile
        print(f"{'case':20s} {'cold s':>8s} {'warm s':>8s}")
        for name in args.cases or CASES:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TE_GRAD_CACHE="1", TE_GRAD_CACHE_DIR=cache)
                cold, warm = (float(subprocess.run([sys.executable, os.path.abspath(__file__), "--case", name],
                                                   capture_output=True, text=True, check=True, env=env
                                                   ).stdout.split()[0]) for _ in range(2))
            print(f"{name:20s} {cold:8.2f} {warm:8.2f}", flush=True)
        return
    print(f"{'case':20s} {'cold build s':>12s} {'stages':>7s} {'loop lines':>10s} {'LLVM KiB':>9s} {'functions':>9s}")
    for name in args.cases or CASES:
        runs = []
        for _ in range(max(1, args.repeat)):
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", name], capture_output=True,
                                  text=True, check=True)
            runs.append(done.stdout.split())
        best = min(runs, key=lambda r: float(r[0]))
        print(f"{name:20s} {float(best[0]):12.2f} {best[1]:>7s} {best[2]:>10s} {best[3]:>9s} {best[4]:>9s}", flush=True)


if __name__ == "__main__":
    main()
