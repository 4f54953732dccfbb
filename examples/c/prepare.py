"""Export the digits model's training step for C and write the data the C program reads.

    python examples/c/prepare.py OUT [--target host|aarch64-linux-gnu|...] [--threads 1]

Writes OUT/digits.o and OUT/digits.h (te_grad.train's digits CNN, Adam with lr 0.01,
Xavier initialization with seed 0), OUT/digits_data.bin (the full batches of one epoch in
the order te_grad.train.digits uses, then the test set) and OUT/python_losses.txt: the
losses the Python trainer gives on the same batches, to compare with the C program's.
"""
import argparse
import os

import numpy as np

import te_grad as tg
from te_grad import train
from te_grad.train import digits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--target", default="host")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    x_tr, y_tr, x_te, y_te = digits.load(0)
    batch = 64
    x = tg.placeholder((batch, 1, 8, 8), name="x")
    y = tg.placeholder((batch,), dtype="int64", name="y")
    trainer = train.Trainer(digits.model(), inputs=[x], targets=[y], loss=tg.nn.softmax_cross_entropy,
                            optimizer=train.Adam(lr=1e-2), init=train.xavier_uniform(seed=0), progress=False)
    trainer.export(os.path.join(args.out, "digits"), target=args.target, threads=args.threads)
    full = [idx for idx in digits.batches(len(x_tr), batch, 0, 0) if len(idx) == batch]
    n_test = len(x_te) // batch * batch
    with open(os.path.join(args.out, "digits_data.bin"), "wb") as f:
        np.array([len(full), n_test], np.int32).tofile(f)
        for idx in full:
            x_tr[idx].astype(np.float32).tofile(f)
            y_tr[idx].astype(np.int64).tofile(f)
        x_te[:n_test].astype(np.float32).tofile(f)
        y_te[:n_test].astype(np.int64).tofile(f)
    losses = [trainer.update(x_tr[idx], y_tr[idx]) for idx in full]
    with open(os.path.join(args.out, "python_losses.txt"), "w") as f:
        f.writelines(f"step {k + 1} loss {v:.6f}\n" for k, v in enumerate(losses))
    accuracy = (trainer.predict(x_te[:batch]).argmax(1) == y_te[:batch]).mean()
    print(f"exported {args.out}/digits.o for {args.target}; {len(full)} batches; Python final loss "
          f"{losses[-1]:.6f}, accuracy on the first test batch {accuracy:.4f}")


if __name__ == "__main__":
    main()
