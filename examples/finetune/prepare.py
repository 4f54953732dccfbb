"""Import a small PyTorch CNN, export its fine-tuning step for C and write the data the C
program reads.

    python examples/finetune/prepare.py OUT [--target host|aarch64-linux-gnu|...] [--steps 20]

The CNN (conv, batch norm, ReLU, max pool, a second conv, a linear head) stands for a
pretrained network: its first convolution is frozen (``requires_grad=False``), the rest is
fine-tuned with SGD (lr 0.02, momentum 0.9) on a small synthetic image task (which quadrant
holds a bright square). Writes

- OUT/finetune.o and OUT/finetune.h: ``finetune_step`` (one SGD step, batch norm's running
  statistics and ``num_batches_tracked`` updated as PyTorch does, the frozen convolution
  carried unchanged) and ``finetune_predict``, with the network's weights as
  ``finetune_initial_state``;
- OUT/finetune_data.bin: int32 steps, batch, channels, height, width, float32 learning
  rate, then each step's batch
  (float32 images, int64 labels), then one test batch;
- OUT/python_losses.txt: the losses te_grad's Python trainer gives on the same batches, to
  compare with the C program's output.
"""
import argparse
import os

import numpy as np
import torch

import te_grad as tg
import te_grad.torch as tgt
from te_grad import train

BATCH, SIZE, CLASSES, LR, MOMENTUM = 16, 8, 4, 0.02, 0.9


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(6)
        self.conv2 = torch.nn.Conv2d(6, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * (SIZE // 2) * (SIZE // 2), CLASSES)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        return self.head(torch.relu(self.conv2(h)).flatten(1))


def make_batch(rng):
    """Images of noise with a bright 3x3 square in one quadrant; the label is the quadrant."""
    y = rng.integers(0, CLASSES, BATCH)
    x = 0.7 * rng.standard_normal((BATCH, 1, SIZE, SIZE))
    for i, q in enumerate(y):
        r, c = (q // 2) * (SIZE // 2) + rng.integers(0, 2), (q % 2) * (SIZE // 2) + rng.integers(0, 2)
        x[i, 0, r:r + 3, c:c + 3] += 1.0
    return x.astype(np.float32), y.astype(np.int64)


def network(seed=0):
    """The network to fine-tune: its weights (seeded), its first convolution frozen."""
    torch.manual_seed(seed)
    net = SmallCNN()
    net.conv1.requires_grad_(False)
    return net


def trainer_for(net):
    x = torch.zeros(BATCH, 1, SIZE, SIZE)
    model = tgt.import_model(net, (x,))
    xp = model.input_placeholders()[0]
    yp = tg.placeholder((BATCH,), "int64", name="y")
    return train.Trainer(model, inputs=[xp], targets=[yp], loss=tg.nn.softmax_cross_entropy,
                         optimizer=train.SGD(lr=LR, momentum=MOMENTUM), progress=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--target", default="host")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    trainer = trainer_for(network())
    files = trainer.export(os.path.join(args.out, "finetune"), target=args.target)
    rng = np.random.default_rng(0)
    batches = [make_batch(rng) for _ in range(args.steps)]
    test = make_batch(rng)
    with open(os.path.join(args.out, "finetune_data.bin"), "wb") as f:
        np.array([args.steps, BATCH, 1, SIZE, SIZE], np.int32).tofile(f)
        np.array([LR], np.float32).tofile(f)
        for x, y in batches + [test]:
            x.tofile(f)
            y.tofile(f)
    losses = [trainer.update(x, y) for x, y in batches]
    with open(os.path.join(args.out, "python_losses.txt"), "w") as f:
        f.writelines(f"step {k + 1} loss {v:.6f}\n" for k, v in enumerate(losses))
    accuracy = (trainer.predict(test[0]).argmax(1) == test[1]).mean()
    print(f"exported {files['object']} for {args.target} ({files['state_bytes']} bytes of state); "
          f"{args.steps} steps; Python final loss {losses[-1]:.6f}, test accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
