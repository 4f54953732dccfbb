"""``python -m te_grad import-check MODULE:FACTORY``: how well te_grad imports a PyTorch model.

::

    python -m te_grad import-check torchvision.models:resnet18 --input 3x64x64 --batch 2
    python -m te_grad import-check path/to/net.py:make_model --input 16 --input 8:int64

``FACTORY`` is a function (or class) of no arguments returning a ``torch.nn.Module``, found
in ``MODULE``: a dotted module path, or a ``.py`` file. Each ``--input SHAPE[:DTYPE]`` is one
model input, its shape without the batch (``3x32x32`` or ``3,32,32``; ``-`` for an input of
the batch alone), its dtype float32 by default (an integer input holds random ids in
``[0, 10)``); the batch is ``--batch`` (default 4). The factory runs under
``torch.manual_seed(0)``; the inputs are drawn with seed 0.

The check, in order (each printed):

1. the op coverage table (:func:`te_grad.torch.coverage`: each core ATen operator of the
   training and evaluation programs, its count, whether te_grad translates it); with an
   operator te_grad does not translate, every such node with its model source line, and the
   exit status is 1 (nothing else is run);
2. the evaluation-mode outputs of te_grad and PyTorch, and their max relative error
   (``max |te_grad - torch| / max |torch|``);
3. the gradients of every trainable parameter of a loss, against PyTorch's autograd: the
   **cross entropy** of the output against random labels where the output is 2-D (classes
   in dimension 1), else the **sum of the outputs squared**; in training mode (batch norm on
   batch statistics), or in evaluation mode where the model has dropout (its masks cannot
   match PyTorch's); the max relative error over all parameters (as above, per parameter)
   and the parameter where it is largest; a parameter whose gradient is rounding noise (the
   bias of a convolution followed by batch norm) is measured against 1% of the largest
   gradient of any parameter instead of its own;
4. the time of one SGD training step (forward, loss, backward, update) of te_grad's
   compiled step and of PyTorch (``torch.optim.SGD``), the median of ``--steps`` steps
   (default 5) after a warm-up.

The exit status is 1 when an operator is not translated or an error exceeds ``--tol``
(default 1e-3), 2 for a bad argument (a factory that cannot be loaded), 0 otherwise.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from typing import List, Sequence, Tuple

import numpy as np

from ..errors import UserError

DTYPES = ("float32", "float64", "int32", "int64")


def load_factory(spec: str):
    """The callable ``FACTORY`` of ``MODULE:FACTORY`` (a dotted module or a ``.py`` file)."""
    if ":" not in spec:
        raise UserError(f"import-check: expected MODULE:FACTORY (torchvision.models:resnet18 or "
                        f"path/to/file.py:make_model), got {spec!r}")
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise UserError(f"import-check: expected MODULE:FACTORY, got {spec!r}")
    if where.endswith(".py") or os.sep in where or "/" in where:
        if not os.path.isfile(where):
            raise UserError(f"import-check: no such file {where!r}")
        name = "_te_grad_import_check_" + os.path.splitext(os.path.basename(where))[0]
        loader = importlib.util.spec_from_file_location(name, where)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        try:
            loader.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's file: report, do not crash
            raise UserError(f"import-check: running {where} failed: {type(e).__name__}: {e}") from e
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UserError(f"import-check: cannot import module {where!r}: {e}") from e
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise UserError(f"import-check: {where} has no attribute {attr!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise UserError(f"import-check: {spec} is not callable")
    return factory


def parse_input(text: str) -> Tuple[Tuple[int, ...], str]:
    """``SHAPE[:DTYPE]`` (``3x32x32``, ``3,32,32:float32``, ``-:int64``) as ``(shape, dtype)``."""
    shape_text, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    if dtype not in DTYPES:
        raise UserError(f"import-check: --input {text!r}: dtype must be one of {', '.join(DTYPES)}")
    shape_text = shape_text.strip()
    if shape_text in ("", "-"):
        return (), dtype
    try:
        shape = tuple(int(s) for s in shape_text.replace("x", ",").split(",") if s.strip())
    except ValueError:
        raise UserError(f"import-check: --input {text!r}: the shape must be whole numbers separated by "
                        "'x' or ',' (3x32x32)") from None
    if any(n < 1 for n in shape):
        raise UserError(f"import-check: --input {text!r}: extents must be positive")
    return shape, dtype


def _rel(a: np.ndarray, b: np.ndarray, floor: float = 0.0) -> float:
    """``max |a - b| / max(max |b|, floor)`` (``max |a - b|`` where that is zero)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    err = float(np.max(np.abs(a - b)))
    scale = max(float(np.max(np.abs(b))), floor)
    return err / scale if scale > 0 else err


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def check(spec: str, inputs: Sequence[str], batch: int = 4, steps: int = 5, tol: float = 1e-3,
          out=None) -> int:
    """Run the check of the module docstring; prints to ``out`` (stdout) and returns the exit status."""
    out = out or sys.stdout
    import torch

    import te_grad as tg
    from te_grad import train
    from te_grad.torch_import import export_program, import_model
    from te_grad.frontends.aten import RULES
    from te_grad.frontends.translate import unsupported
    from te_grad.torch import coverage

    if batch < 2:
        raise UserError(f"import-check: --batch must be at least 2 (torch.export specializes a batch of 1), "
                        f"got {batch}")
    if not inputs:
        raise UserError("import-check: give each model input as --input SHAPE[:DTYPE] (its shape without "
                        "the batch, e.g. --input 3x32x32)")
    factory = load_factory(spec)
    torch.manual_seed(0)
    try:
        net = factory()
    except Exception as e:  # noqa: BLE001 - the user's factory
        raise UserError(f"import-check: {spec}() failed: {type(e).__name__}: {e}") from e
    if not isinstance(net, torch.nn.Module):
        raise UserError(f"import-check: {spec}() returned a {type(net).__name__}, not a torch.nn.Module")
    rng = np.random.default_rng(0)
    examples = []
    for text in inputs:
        shape, dtype = parse_input(text)
        if dtype.startswith("float"):
            a = rng.standard_normal((batch,) + shape).astype(dtype)
        else:
            a = rng.integers(0, 10, (batch,) + shape).astype(dtype)
        examples.append(a)
    xs = [torch.from_numpy(a) for a in examples]

    # 1. coverage
    rows = coverage(net, xs)
    width = max([len("operator")] + [len(r[0]) for r in rows])
    print(f"{spec}: {type(net).__name__}, inputs {[list(a.shape) for a in examples]}", file=out)
    print(f"{'operator':<{width}}  {'count':>5}  translated", file=out)
    for name, count, ok in rows:
        print(f"{name:<{width}}  {count:>5}  {'yes' if ok else 'NO'}", file=out)
    if not all(ok for _, _, ok in rows):
        missing = []
        for training in (True, False):
            ep, _ = export_program(net, xs, training)
            missing += [m for m in unsupported(ep.graph.nodes, RULES) if m not in missing]
        print(f"\n{len(missing)} node(s) use operators te_grad does not translate:", file=out)
        for line in missing:
            print(f"  {line}", file=out)
        return 1
    has_dropout = any(name.startswith("aten.native_dropout") for name, _, _ in rows)

    try:
        return _compare(net, xs, examples, rng, spec, batch, steps, tol, has_dropout, out)
    except UserError as err:
        print(f"\nFAILED: {err}", file=out)
        return 1


def _compare(net, xs, examples, rng, spec, batch, steps, tol, has_dropout, out) -> int:
    """Steps 2 to 4 of the module docstring."""
    import torch

    import te_grad as tg
    from te_grad import train
    from te_grad.torch_import import import_model
    failed = []
    # 2. evaluation-mode outputs
    model = import_model(net, xs)
    placeholders = model.input_placeholders()
    was = net.training
    net.eval()
    with torch.no_grad():
        want = net(*xs)
    net.train(was)
    if not isinstance(want, torch.Tensor):
        raise UserError(f"import-check: the model returns a {type(want).__name__}; import-check compares "
                        "models of one tensor output")
    want = want.numpy()
    two_d = want.ndim == 2 and want.dtype.kind == "f"
    labels = rng.integers(0, want.shape[1], batch).astype(np.int64) if two_d else None
    if two_d:
        y = tg.placeholder((batch,), "int64", name="y")
        targets, loss_fn, target_arrays = [y], tg.nn.softmax_cross_entropy, [labels]
    else:
        targets, loss_fn, target_arrays = [], _sum_of_squares, []
    trainer = train.Trainer(model, inputs=placeholders, targets=targets, loss=loss_fn,
                            optimizer=train.SGD(lr=1e-3), progress=False)
    got = trainer.predict(*examples)
    err = _rel(got, want)
    ok = err <= tol
    failed += [] if ok else ["outputs"]
    print(f"\neval outputs {list(want.shape)}: max relative error {err:.2e} {'ok' if ok else 'FAILS'} "
          f"(tolerance {tol:g})", file=out)

    # 3. gradients of the loss
    training = not has_dropout
    loss_name = "cross entropy against random labels" if two_d else "sum of the outputs squared"
    grads = _te_grad_gradients(model, trainer, placeholders, targets, loss_fn, examples + target_arrays, training)
    net.train(training)
    for p in net.parameters():
        p.grad = None
    try:
        o = net(*xs)
        loss = torch.nn.functional.cross_entropy(o, torch.from_numpy(labels)) if two_d else (o * o).sum()
        loss.backward()
    finally:
        net.train(was)
    named = dict(net.named_parameters())
    want_grads = {name: (named[name].grad.numpy() if named[name].grad is not None else np.zeros_like(g))
                  for name, g in grads.items()}
    # a parameter whose gradient is rounding noise (a bias before batch norm) is measured
    # against 1% of the largest gradient of any parameter
    floor = 1e-2 * max([float(np.max(np.abs(w))) for w in want_grads.values() if w.size] + [0.0])
    worst, worst_name = 0.0, ""
    for name, g in grads.items():
        e = _rel(g, want_grads[name], floor)
        if e >= worst:
            worst, worst_name = e, name
    ok = worst <= tol
    failed += [] if ok else ["gradients"]
    mode = "training mode" if training else "evaluation mode (the model has dropout)"
    print(f"gradients of the {loss_name} ({len(grads)} parameters, {mode}): max relative error "
          f"{worst:.2e} at {worst_name} {'ok' if ok else 'FAILS'}", file=out)

    # 4. a training step's time
    trainer.compile()
    batch_arrays = examples + target_arrays
    te_ms = _median_ms(lambda: trainer.update(*batch_arrays), steps)
    net.train()
    opt = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=1e-3)
    labels_t = torch.from_numpy(labels) if two_d else None

    def torch_step():
        opt.zero_grad()
        o = net(*xs)
        loss = torch.nn.functional.cross_entropy(o, labels_t) if two_d else (o * o).sum()
        loss.backward()
        opt.step()
    torch_ms = _median_ms(torch_step, steps)
    net.train(was)
    print(f"SGD training step, batch {batch} (median of {steps}): te_grad {te_ms:.3f} ms, PyTorch "
          f"{torch_ms:.3f} ms ({te_ms / torch_ms:.2f}x)", file=out)
    if failed:
        print(f"\nFAILED: {', '.join(failed)} disagree with PyTorch", file=out)
        return 1
    print("\nok: every operator translated, outputs and gradients agree with PyTorch", file=out)
    return 0


def _sum_of_squares(out):
    import te_grad as tg
    sq = tg.compute(out.shape, lambda *i: out[i] * out[i], name="import_check_square")
    return tg.nn.sum(sq)


def _te_grad_gradients(model, trainer, placeholders, targets, loss_fn, arrays, training: bool):
    """``{name: gradient}`` of ``loss_fn`` for every trainable parameter, one compiled kernel
    on the trainer's current parameters and states."""
    import te_grad as tg
    from te_grad.train import Context
    seed = tg.placeholder((), "int64", name="seed")
    ctx = Context(training=training, seed=seed)
    out = model(*placeholders, ctx)
    loss = loss_fn(out, *targets)
    params = model.parameters()
    grads = tg.gradient(loss, [p.placeholder for p in params])
    from te_grad.graph import topo_order
    reads = {id(t) for t in topo_order(list(grads)) if t.is_placeholder}
    states = [s for s in model.states() if id(s.placeholder) in reads]
    kernel = tg.build(grads, placeholders + targets + [seed] + [p.placeholder for p in params]
                      + [s.placeholder for s in states])
    values = {**trainer.params, **trainer.states}
    got = kernel(*arrays, np.array(1, np.int64), *[values[p.name] for p in params],
                 *[values[s.name] for s in states])
    got = got if isinstance(got, (list, tuple)) else [got]
    return {p.name: np.asarray(g) for p, g in zip(params, got)}


def add_parser(sub) -> argparse.ArgumentParser:
    """The ``import-check`` subcommand's parser (see :func:`main`)."""
    p = sub.add_parser(
        "import-check", help="import a PyTorch model: op coverage, outputs, gradients and a step's time against "
                             "PyTorch",
        description="Import a torch.nn.Module made by MODULE:FACTORY (torchvision.models:resnet18, "
                    "path/to/file.py:make_model) and print the op coverage table; then compare the "
                    "evaluation-mode outputs and the parameter gradients of a loss (cross entropy for a "
                    "2-D output, else the sum of the outputs squared) with PyTorch's, and time an SGD "
                    "training step of both. Exit status 1 if an operator is not translated (each listed "
                    "with its source line) or a value disagrees.")
    p.add_argument("factory", metavar="MODULE:FACTORY")
    p.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                   help="a model input: its shape without the batch (3x32x32), its dtype (float32 by "
                        "default; integer inputs hold ids in [0, 10)); repeat for several inputs")
    p.add_argument("--batch", type=int, default=4, help="the batch size (default 4, at least 2)")
    p.add_argument("--steps", type=int, default=5, help="training steps timed (default 5)")
    p.add_argument("--tol", type=float, default=1e-3, help="the largest relative error accepted (default 1e-3)")
    return p


def main(args) -> int:
    """Run ``import-check`` for parsed ``args``; a bad argument prints an error and returns 2."""
    try:
        return check(args.factory, args.input, batch=args.batch, steps=args.steps, tol=args.tol)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


__all__: List[str] = ["check", "load_factory", "parse_input", "add_parser", "main"]
