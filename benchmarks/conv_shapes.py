"""2-D convolutions of every spatial size, forward and both gradients, next to PyTorch eager.

    python benchmarks/conv_shapes.py [--threads 1] [--quick] [--ops layer4_conv1 ...]

The shapes are those of ResNet-18 on CIFAR-size images (32 x 32, batch 32, the ImageNet
stem: a 7 x 7 stride-2 convolution and a max-pool leave 8 x 8 for layer1, 4 x 4 for
layer2, 2 x 2 for layer3 and 1 x 1 for layer4), each layer's 3 x 3 convolutions and its
1 x 1 stride-2 shortcut, where the output images are tiny and the channels many. For each
shape, three te_grad kernels built with ``tg.build`` at the given thread count: the
forward, the input gradient and the weight gradient (``tg.gradient`` for a head, each
kernel alone, as a training step's stages are), and PyTorch's ``conv2d`` under
``no_grad`` and ``aten.convolution_backward`` (what autograd runs) for the input alone and
the weight alone. Values are checked against PyTorch first. Printed: ms, the ratios te_grad /
PyTorch (below 1: te_grad faster) and the cold build time of the three kernels (disk
cache off).
"""
import os
import time

os.environ.setdefault("TE_GRAD_CACHE", "0")

import numpy as np  # noqa: E402

import te_grad as tg  # noqa: E402
from te_grad import nn  # noqa: E402
from te_grad.tools.benchmark import Timer, cpu_name, rel_err, script_options  # noqa: E402

#: name: (batch, in channels, image size, out channels, kernel, stride, padding)
SHAPES = {
    "stem": (32, 3, 32, 64, 7, 2, 3),
    "layer1": (32, 64, 8, 64, 3, 1, 1),
    "layer2_conv1": (32, 64, 8, 128, 3, 2, 1),
    "layer2_conv2": (32, 128, 4, 128, 3, 1, 1),
    "layer2_down": (32, 64, 8, 128, 1, 2, 0),
    "layer3_conv1": (32, 128, 4, 256, 3, 2, 1),
    "layer3_conv2": (32, 256, 2, 256, 3, 1, 1),
    "layer3_down": (32, 128, 4, 256, 1, 2, 0),
    "layer4_conv1": (32, 256, 2, 512, 3, 2, 1),
    "layer4_conv2": (32, 512, 1, 512, 3, 1, 1),
    "layer4_down": (32, 256, 2, 512, 1, 2, 0),
}


def measure(shape, threads, timer, torch):
    n, c, size, o, k, stride, pad = shape
    x, w = tg.placeholder((n, c, size, size), name="x"), tg.placeholder((o, c, k, k), name="w")
    y = nn.conv2d(x, w, stride=stride, padding=pad)
    head = tg.placeholder(y.shape, name="head")
    dx, = tg.gradient(y, [x], head=head)
    dw, = tg.gradient(y, [w], head=head)
    t0 = time.perf_counter()
    kerns = {"fwd": tg.build([y], [x, w], threads=threads),
             "dx": tg.build([dx], [w, head], threads=threads),
             "dw": tg.build([dw], [x, head], threads=threads)}
    for kern in kerns.values():
        kern.wait()
    build = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    xa = rng.standard_normal((n, c, size, size)).astype(np.float32)
    wa = rng.standard_normal((o, c, k, k)).astype(np.float32)
    ha = rng.standard_normal(tuple(y.shape)).astype(np.float32)
    args = {"fwd": (xa, wa), "dx": (wa, ha), "dw": (xa, ha)}
    X = torch.from_numpy(xa).requires_grad_()
    W = torch.from_numpy(wa).requires_grad_()
    H = torch.from_numpy(ha)
    conv = torch.nn.functional.conv2d

    def fwd():
        with torch.no_grad():
            return conv(X, W, stride=stride, padding=pad)

    def grad(mask):  # what autograd runs for a convolution's backward, one gradient alone
        def run():
            got = torch.ops.aten.convolution_backward(H, X, W, None, [stride] * 2, [pad] * 2, [1, 1],
                                                      False, [0, 0], 1, mask)
            return got[0] if mask[0] else got[1]
        return run
    torch_fns = {"fwd": fwd, "dx": grad([True, False, False]), "dw": grad([False, True, False])}
    out = {}
    for part, kern in kerns.items():
        got, want = kern(*args[part]), torch_fns[part]().detach().numpy()
        err = rel_err(got, want)
        if not err < 1e-3:
            raise AssertionError(f"{shape} {part}: te_grad differs from PyTorch by {err:.2e}")
        times = timer({"te_grad": lambda: kern(*args[part]), "torch": torch_fns[part]})
        out[part] = (times["te_grad"]["ms"], times["torch"]["ms"])
    return out, build


def main(argv=None):
    args, torch, timer = script_options(argv, __doc__.split("\n\n")[0], list(SHAPES), Timer(1, 5, 0.5))
    print(f"# conv_shapes, {args.threads} threads, {cpu_name()}; times in ms, ratio te_grad / PyTorch")
    print(f"{'shape':14} {'(N, C, HxW -> O, k, s, p)':30} "
          + " ".join(f"{p + ' tg':>9} {'torch':>7} {'ratio':>6}" for p in ("fwd", "dx", "dw")) + f" {'build s':>8}")
    ratios = []
    for name, shape in SHAPES.items():
        if args.ops and name not in args.ops:
            continue
        r, build = measure(shape, args.threads, timer, torch)
        n, c, size, o, k, s, p = shape
        desc = f"({n}, {c}, {size}x{size} -> {o}, {k}, {s}, {p})"
        cells = []
        for part in ("fwd", "dx", "dw"):
            te, pt = r[part]
            ratios.append(te / pt)
            cells.append(f"{te:9.3f} {pt:7.3f} {te / pt:6.2f}")
        print(f"{name:14} {desc:30} " + " ".join(cells) + f" {build:8.2f}", flush=True)
    if ratios:
        print(f"geomean ratio {float(np.exp(np.mean(np.log(ratios)))):.2f}, worst {max(ratios):.2f}")


if __name__ == "__main__":
    main()
