"""A real model trained end to end: a small CNN on the 8x8 handwritten digits scikit-learn ships.

``python -m te_grad train-digits`` (``pip install -e ".[examples]"``) trains
``Conv2d(1, 16, 3, padding=1) -> ReLU -> MaxPool2d(2) -> Flatten -> Linear(256, 10)`` with
Adam on 80% of the 1,797 images and reports the accuracy on the other 20%. With PyTorch
installed, the same model is trained next to it from the same initial weights, on the
same batches, with the same optimizer: the two loss curves are compared step by step
and the time per epoch is given side by side, at the same number of threads.
"""
from __future__ import annotations

import sys
import time
from typing import Dict, Optional

import numpy as np

from .. import nn, placeholder
from ..errors import UserError


def load(seed: int = 0, test_fraction: float = 0.2):
    """``(x_train, y_train, x_test, y_test)``: images as float32 (N, 1, 8, 8) in [0, 1], labels int64."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise UserError("the digits data set comes with scikit-learn: pip install -e \".[examples]\"") from None
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = int(round(len(x) * test_fraction))
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def model():
    """The CNN of the module docstring, as te_grad layers."""
    from . import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
    return Sequential(Conv2d(1, 16, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(16 * 4 * 4, 10))


def torch_model(torch):
    """Its PyTorch twin (the same parameter names)."""
    t = torch.nn
    return t.Sequential(t.Conv2d(1, 16, 3, padding=1), t.ReLU(), t.MaxPool2d(2), t.Flatten(), t.Linear(256, 10))


def batches(n: int, batch: int, epoch: int, seed: int):
    """The index batches of one epoch (shuffled by ``seed`` and the epoch), the last one ragged."""
    order = np.random.default_rng(seed * 1000 + epoch).permutation(n)
    return [order[k:k + batch] for k in range(0, n, batch)]


def run(epochs: int = 10, lr: float = 1e-2, batch: int = 64, seed: int = 0, threads: Optional[int] = None,
        compare: bool = True, out=None, plot: Optional[str] = None) -> Dict[str, object]:
    """Train the te_grad model (and its PyTorch twin when ``compare`` and PyTorch is there);
    print progress; return losses, accuracies and times."""
    from . import Adam, Trainer, xavier_uniform
    out = sys.stdout if out is None else out
    x_tr, y_tr, x_te, y_te = load(seed)
    x = placeholder((batch, 1, 8, 8), name="x")
    y = placeholder((batch,), dtype="int64", name="y")
    net = model()
    t0 = time.perf_counter()
    trainer = Trainer(net, inputs=[x], targets=[y], loss=nn.softmax_cross_entropy, optimizer=Adam(lr=lr),
                      init=xavier_uniform(seed=seed), threads=threads, progress=False)
    initial = trainer.params
    trainer.compile(batch, len(x_tr) % batch or batch)  # and the ragged last batch of an epoch
    setup = time.perf_counter() - t0
    print(f"te_grad: {len(x_tr)} training and {len(x_te)} test images; step kernel built in {setup:.2f} s",
          file=out)
    ours = _train_te_grad(trainer, x_tr, y_tr, x_te, y_te, epochs, batch, seed, out)
    result = {"te_grad": ours, "setup_s": setup}
    torch = _torch() if compare else None
    if torch is not None:
        n_threads = threads if threads is not None else trainer.threads_used
        torch.set_num_threads(n_threads)
        theirs = _train_torch(torch, initial, x_tr, y_tr, x_te, y_te, epochs, batch, seed, lr, out)
        result["torch"] = theirs
        first = len(batches(len(x_tr), batch, 0, seed))
        a, b = np.array(ours["losses"][:first]), np.array(theirs["losses"][:first])
        result["first_epoch_max_rel_diff"] = float(np.max(np.abs(a - b) / np.abs(b)))
        print(f"first epoch: the loss curves differ by at most {result['first_epoch_max_rel_diff']:.1e} "
              f"(relative) over {first} steps", file=out)
        for name, r in (("te_grad", ours), ("PyTorch", theirs)):
            print(f"{name:8s}: {np.median(r['epoch_s']) * 1e3:8.1f} ms per epoch (median), test accuracy "
                  f"{r['accuracy'][-1]:.4f}", file=out)
        print(f"time per epoch, te_grad / PyTorch: {np.median(ours['epoch_s']) / np.median(theirs['epoch_s']):.2f} "
              f"at {n_threads} thread(s)", file=out)
    if plot:
        _plot(result, plot)
        print(f"loss curves: {plot}", file=out)
    return result


def _train_te_grad(trainer, x_tr, y_tr, x_te, y_te, epochs, batch, seed, out):
    losses, accuracy, epoch_s = [], [], []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        for idx in batches(len(x_tr), batch, epoch, seed):
            losses.append(trainer.update(x_tr[idx], y_tr[idx]))
        epoch_s.append(time.perf_counter() - t0)
        accuracy.append(float((trainer.predict(x_te).argmax(1) == y_te).mean()))
        print(f"  epoch {epoch + 1:2d}/{epochs}: loss {np.mean(losses[-len(batches(len(x_tr), batch, epoch, seed)):]):.4f}, "
              f"test accuracy {accuracy[-1]:.4f}, {epoch_s[-1] * 1e3:.1f} ms", file=out, flush=True)
    return {"losses": losses, "accuracy": accuracy, "epoch_s": epoch_s}


def _train_torch(torch, initial, x_tr, y_tr, x_te, y_te, epochs, batch, seed, lr, out):
    net = torch_model(torch)
    net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in initial.items()})
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    xt, yt, xe = torch.from_numpy(x_tr), torch.from_numpy(y_tr), torch.from_numpy(x_te)
    losses, accuracy, epoch_s = [], [], []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        for idx in batches(len(x_tr), batch, epoch, seed):
            ix = torch.from_numpy(idx)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(xt[ix]), yt[ix])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        epoch_s.append(time.perf_counter() - t0)
        with torch.no_grad():
            accuracy.append(float((net(xe).argmax(1).numpy() == y_te).mean()))
    print(f"PyTorch {torch.__version__}: the same model, initial weights, batches and optimizer: test accuracy "
          f"{accuracy[-1]:.4f}", file=out)
    return {"losses": losses, "accuracy": accuracy, "epoch_s": epoch_s}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(result["te_grad"]["losses"], label="te_grad (one kernel per step)", lw=1.5)
    if "torch" in result:
        ax.plot(result["torch"]["losses"], label="PyTorch, same initialization and batches", lw=3, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
