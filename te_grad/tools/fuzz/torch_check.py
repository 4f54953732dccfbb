"""The checks of a random ``torch.nn.Module`` (:mod:`.torch_models`) through the PyTorch importer.

The checks (:func:`check`) against PyTorch, run over many seeds by :func:`run`
(``python -m te_grad fuzz --torch``):

0. a dynamic batch asked for is kept (no generated module depends on its batch's value, so an
   import that makes the batch exact, or a training step that is not built on a batch size
   variable, is a failure, ``static-batch``);
1. the forward of the imported model in evaluation and in training mode, by the reference
   evaluator (``float64``: relative error ``1e-10`` of the output's largest value;
   ``float32``: ``1e-4``, against PyTorch's module run in float64 on the same values, so that
   PyTorch's own float32 rounding is not counted against te_grad (a bias gradient that is
   exactly zero came out of PyTorch's float32 as ``2^-13``), each element widened by 20 times
   PyTorch's own float32 error there, where the module is ill-conditioned (a layer norm over
   two elements);
2. the parameter gradients of the loss, the sum of ``sum(W * output)`` (``W`` random) over the
   outputs read with their gradient, in a random mode, by the evaluator and by a kernel
   compiled with ``tg.build``;
3. one :class:`te_grad.train.Trainer` SGD step on the loss (the ``stop_gradient`` reads
   included), with weight decay (which moves a parameter whose PyTorch ``grad`` is zeros and
   leaves one whose ``grad`` is None): the new parameters, batch norm's running statistics and
   ``num_batches_tracked``;
4. with a dynamic batch, the same kernels at another batch size (1 to 3 more): the Trainer's
   prediction of every output after that step, then the parameters after a second step
   (``mismatch-other-batch``);
5. with ``dynamo`` (``--dynamo``), the module through ``torch.compile`` with te_grad's backend
   (:class:`te_grad.torch.Backend`) in the gradient's mode, at the spec's batch and at a larger
   one (Dynamo's second compile, on a symbolic batch): the outputs and the parameter gradients
   against PyTorch's float64 module fed the same batches (``mismatch-dynamo``).

An import that te_grad refuses with a :class:`~te_grad.errors.UserError` naming an operator
(no rule, or a rule refusing its arguments) is ``rejected``, counted by operator; any other
disagreement, error or crash is a failure, printed as a script that rebuilds the module from
its seed. Torch is imported here and in :mod:`.torch_models` only, lazily: ``te_grad`` and the
program fuzzer never import it.
"""
from __future__ import annotations

import copy
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, TextIO

import numpy as np

from .check import _close as _close_rel, _Mismatch
from .torch_models import FAMILIES, Spec, build_module, generate

#: outcomes that are not failures
PASSING = ("ok", "rejected")

# -- the checks ----------------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str                      # "ok", "rejected", "mismatch-...", "export-failed", "user-error", "crash"
    detail: str = ""
    rejected_ops: List[str] = field(default_factory=list)
    families: List[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.kind not in PASSING


_NO_RULE = re.compile(r"ATen operators te_grad does not translate \(([^)]*)\)")
_REFUSED = re.compile(r": (aten\.[\w.]+) at node \S+(?: \(.*?\))?: (?!te_grad gives)")


def refused_ops(message: str) -> List[str]:
    """The operators a UserError says te_grad refuses (no rule, or a rule refusing), or []."""
    m = _NO_RULE.search(message)
    if m:
        return [o.strip() for o in m.group(1).split(",")]
    m = _REFUSED.search(message)
    if m and "te_grad gives" not in message:
        return [m.group(1)]
    return []


def _close(got, want, rtol, what, kind, noise=None):
    """``got`` within ``rtol`` of ``want``'s largest value, and within ``rtol`` absolutely (values
    of rounding noise, such as a normalization over one element, are compared as zeros). For
    a float32 result, ``noise`` is PyTorch's own float32 result of what ``want`` holds in
    float64: each element of ``got`` may then also be off by 20 times PyTorch's error at that
    element (the module's conditioning there, not te_grad's), and where PyTorch's float32
    overflows too, ``got`` is compared with that."""
    atol = rtol
    if noise is not None and np.shape(noise) == np.shape(want) == np.shape(got):  # else: a shape mismatch
        noise, want = np.asarray(noise, np.float64), np.asarray(want, np.float64)
        got64 = np.asarray(got, np.float64)
        diff = np.abs(noise - want)
        atol = rtol + 20.0 * np.where(np.isfinite(diff), diff, 0.0)
        overflowed = ~np.isfinite(noise) & np.isfinite(want) & ((got64 == noise) | (np.isnan(got64) & np.isnan(noise)))
        want = np.where(overflowed, noise, want)
    _close_rel(got, want, rtol, what, kind, atol=atol)


def _inputs(spec: Spec, rng, batch: int = None):
    """The module's inputs, at ``batch`` (default: the spec's)."""
    import torch
    batch = spec.batch if batch is None else batch
    x = rng.uniform(-1.0, 1.0, size=(batch,) + tuple(spec.input_shape[1:])).astype(spec.dtype)
    arrays = [x]
    if spec.ids is not None:
        arrays.append(rng.integers(0, spec.ids[1], size=(batch, spec.ids[0])).astype("int64"))
    return arrays, [torch.from_numpy(a.copy()) for a in arrays]


def _listed(out) -> list:
    """A module's (or a model's) result as a list of its outputs."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _torch_loss(outs, heads, reads):
    """PyTorch's loss of the spec's outputs: ``sum(head * out)`` over the outputs read, those read
    under ``stop`` detached; ``None`` when it needs no backward (no gradient reaches it)."""
    import torch
    loss = None
    for o, h, how in zip(outs, heads, reads):
        if how != "none":
            term = ((o.detach() if how == "stop" else o) * torch.from_numpy(h)).sum()
            loss = term if loss is None else loss + term
    return loss if loss is not None and loss.requires_grad else None


def _te_loss(outs, heads, reads):
    """te_grad's loss of the same (``heads``: one per output read; ``stop_gradient`` for ``stop``)."""
    import te_grad as tg
    heads, loss = iter(heads), None
    for o, how in zip(_listed(outs), reads):
        if how != "none":
            if how == "stop":
                o = tg.compute(o.shape, lambda *i, o=o: tg.stop_gradient(o[i]), name="stopped")
            term = tg.nn.sum(tg.nn.multiply(o, next(heads)))
            loss = term if loss is None else tg.nn.add(loss, term)
    return loss


def _torch_run(net, tensors, training, heads=None, reads=None):
    """PyTorch's outputs (and parameter gradients of :func:`_torch_loss` of ``heads``) on a copy of ``net``."""
    net = copy.deepcopy(net)
    net.train(training)
    outs = _listed(net(*tensors))
    grads = {}
    if heads is not None:
        net.zero_grad()
        loss = _torch_loss(outs, heads, reads)
        if loss is not None:
            loss.backward()
        grads = {n: (p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), p.detach().numpy().dtype))
                 for n, p in net.named_parameters()}
    return [o.detach().numpy() for o in outs], grads, net


def check(spec: Spec, compile_: bool = True, dynamo: bool = False) -> Outcome:
    """Import ``spec``'s module and check it against PyTorch (see the module docstring)."""
    families = sorted({n["family"] for n in spec.nodes})
    try:
        import torch  # noqa: F401
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _check(spec, compile_, dynamo)
    except _Mismatch as m:
        return Outcome(m.kind, m.detail, families=families)
    except Exception as e:  # noqa: BLE001 - every error is an outcome
        from ...errors import UserError
        text = f"{type(e).__name__}: {e}"
        if isinstance(e, UserError):
            if "torch.export failed" in str(e):
                return Outcome("export-failed", text, families=families)
            ops = refused_ops(str(e))
            if ops:
                return Outcome("rejected", text, rejected_ops=ops, families=families)
            return Outcome("user-error", text + "\n" + traceback.format_exc(), families=families)
        return Outcome("crash", text + "\n" + traceback.format_exc(), families=families)
    return Outcome("ok", families=families)


def _check(spec: Spec, compile_: bool, dynamo: bool = False) -> None:
    import te_grad as tg
    from te_grad import train
    from te_grad.graph import topo_order
    from te_grad.torch import import_model

    rng = np.random.default_rng(spec.seed + 17)
    net = build_module(spec)
    arrays, tensors = _inputs(spec, rng)
    rtol = 1e-10 if spec.dtype == "float64" else 1e-4
    # PyTorch's results: the same module and values in float64 (exact to float32's tolerance);
    # for a float32 module, PyTorch's float32 results measure the module's rounding noise
    ref, ref_tensors = copy.deepcopy(net).double(), _float64(tensors)
    f32 = spec.dtype == "float32"
    model = import_model(net, tuple(tensors), dynamic_batch=spec.dynamic_batch)
    if spec.dynamic_batch and not model.dynamic_batch:   # no generated module depends on its batch's value
        raise _Mismatch("static-batch", f"a dynamic batch was asked for, the import made it exact: "
                                        f"{model.static_reason}")
    xs = model.input_placeholders()
    params, states = model.parameters(), model.states()
    feed = {p.placeholder: p.value for p in params}
    feed.update({s.placeholder: np.asarray(s.initial) for s in states})
    feed.update(dict(zip(xs, arrays)))

    reads = spec.reads or ["grad"]
    # 1. the forward in both modes, every output
    for training in (False, True):
        want, _, _ = _torch_run(ref, ref_tensors, training)
        noise = _torch_run(net, tensors, training)[0] if f32 else [None] * len(want)
        out = _listed(model(*xs, train.Context(training=training)))
        if len(out) != len(want):
            raise _Mismatch("mismatch-outputs", f"the model returns {len(out)} outputs, the module {len(want)}")
        got = tg.evaluate(out, feed)
        for k, (g, w, n) in enumerate(zip(got, want, noise)):
            _close(g, w, rtol, f"forward ({'training' if training else 'evaluation'}), output {k}",
                   f"mismatch-forward-{'train' if training else 'eval'}", n)

    # 2. parameter gradients of the loss: sum(head * out) over the outputs read (as ``reads`` says)
    heads = [rng.standard_normal(np.shape(w)).astype(spec.dtype) for w in want]
    wide = [h.astype(np.float64) for h in heads]
    _, want_grads, _ = _torch_run(ref, ref_tensors, spec.grad_training, wide, reads)
    noise_grads = _torch_run(net, tensors, spec.grad_training, heads, reads)[1] if f32 else {}
    differentiated = [k for k, how in enumerate(reads) if how == "grad"]
    if params and differentiated:  # the VJP of the outputs read with their gradient, one head each
        out = _listed(model(*xs, train.Context(training=spec.grad_training)))
        head_phs = [tg.placeholder(out[k].shape, dtype=out[k].dtype, name=f"head{k}") for k in differentiated]
        grads = tg.gradient([out[k] for k in differentiated], [p.placeholder for p in params], head=head_phs)
        feed.update({ph: heads[k] for ph, k in zip(head_phs, differentiated)})
        got = tg.evaluate(grads, feed)
        for p, g in zip(params, got):
            _close(g, want_grads[p.name], rtol, f"gradient of {p.name} (evaluator)", "mismatch-grad-evaluator",
                   noise_grads.get(p.name))
        if compile_:
            inputs = xs + [p.placeholder for p in params] + [s.placeholder for s in states] + head_phs
            used = {id(t) for t in topo_order(grads)}
            inputs = [i for i in inputs if id(i) in used]
            kernel = tg.build(grads, inputs)
            got = kernel(*[feed[i] for i in inputs])
            got = got if isinstance(got, (list, tuple)) else [got]
            for p, g in zip(params, got):
                _close(g, want_grads[p.name], rtol, f"gradient of {p.name} (compiled)", "mismatch-grad-compiled",
                       noise_grads.get(p.name))

    # 3. one SGD step of the Trainer on that loss (the stop_gradient reads too), batch norm statistics included
    lr = 0.5
    read = [k for k, how in enumerate(reads) if how != "none"]
    ys = [tg.placeholder(tuple(np.shape(heads[k])), dtype=spec.dtype, name=f"y{k}") for k in read]
    trainer = train.Trainer(model, inputs=xs, targets=ys, loss=lambda o, *t: _te_loss(o, t, reads),
                            optimizer=train.SGD(lr=lr, weight_decay=DECAY), progress=False, dynamic_batch=spec.dynamic_batch)
    trainer.update(*arrays, *[heads[k] for k in read])
    if spec.dynamic_batch and trainer.static_reason:   # the step fell back to a kernel per batch size
        raise _Mismatch("static-batch", f"the training step was not built on a batch size variable: "
                                        f"{trainer.static_reason}")
    tnet = _torch_step(ref, ref_tensors, wide, reads, lr)
    nnet = _torch_step(net, tensors, heads, reads, lr) if f32 else None
    _close_params(trainer, tnet, nnet, rtol, "after a step", "mismatch-step-params")
    have = trainer.states
    noise = dict(nnet.named_buffers()) if f32 else {}
    for n, b in tnet.named_buffers():
        if n in have:
            _close(have[n], b.numpy(), rtol, f"buffer {n} after a step", "mismatch-step-states",
                   noise[n].numpy() if n in noise else None)

    # 4. with a dynamic batch, the same kernels at another batch size: a prediction, then a step
    if spec.dynamic_batch:
        other = spec.batch + 1 + int(rng.integers(0, 3))
        arrays2, tensors2 = _inputs(spec, rng, other)
        ref2 = _float64(tensors2)
        want = _torch_run(tnet, ref2, False)[0]
        noise = _torch_run(nnet, tensors2, False)[0] if f32 else [None] * len(want)
        got = _listed(trainer.predict(*arrays2))
        if len(got) != len(want):
            raise _Mismatch("mismatch-other-batch", f"the prediction has {len(got)} outputs, the module {len(want)}")
        for k, (g, w, n) in enumerate(zip(got, want, noise)):
            _close(g, w, rtol, f"prediction at batch {other} after a step, output {k}", "mismatch-other-batch", n)
        heads2 = [rng.standard_normal(np.shape(w)).astype(spec.dtype) for w in want]
        trainer.update(*arrays2, *[heads2[k] for k in read])
        _close_params(trainer, _torch_step(tnet, ref2, [h.astype(np.float64) for h in heads2], reads, lr),
                      _torch_step(nnet, tensors2, heads2, reads, lr) if f32 else None, rtol,
                      f"after a step at batch {other}", "mismatch-other-batch")

    if dynamo:
        _check_dynamo(spec, net, rng, rtol)


def _check_dynamo(spec: Spec, net, rng, rtol: float) -> None:
    """5. ``torch.compile(module, backend=te_grad.torch.Backend())`` in the gradient's mode at the
    spec's batch, then at a larger one (Dynamo's second compile, on a symbolic batch): the outputs
    and the parameter gradients of :func:`_torch_loss` against PyTorch's float64 module fed the
    same batches (a float32 module's own eager run measures its rounding noise)."""
    import torch
    from te_grad.torch import Backend
    torch._dynamo.reset()
    reads = spec.reads or ["grad"]
    f32 = spec.dtype == "float32"
    nets = {"compiled": copy.deepcopy(net), "ref": copy.deepcopy(net).double()}
    if f32:
        nets["noise"] = copy.deepcopy(net)
    for m in nets.values():
        m.train(spec.grad_training)
    run = dict(nets, compiled=torch.compile(nets["compiled"], backend=Backend()))
    try:
        for batch in (spec.batch, spec.batch + 1 + int(rng.integers(0, 3))):
            _, tensors = _inputs(spec, rng, batch)
            feeds = {"compiled": tensors, "ref": _float64(tensors), "noise": tensors}
            outs = {k: _listed(run[k](*feeds[k])) for k in nets}
            heads = [rng.standard_normal(tuple(o.shape)).astype(spec.dtype) for o in outs["ref"]]
            for k in nets:
                nets[k].zero_grad()
                loss = _torch_loss(outs[k], [h.astype(np.float64) if k == "ref" else h for h in heads], reads)
                if loss is not None:
                    loss.backward()
            for j, (g, w) in enumerate(zip(outs["compiled"], outs["ref"])):
                _close(g.detach().numpy(), w.detach().numpy(), rtol, f"output {j} at batch {batch} (torch.compile)",
                       "mismatch-dynamo", outs["noise"][j].detach().numpy() if f32 else None)
            grads = {k: dict(nets[k].named_parameters()) for k in nets}
            for name, w in grads["ref"].items():
                if w.grad is None:
                    continue
                g = grads["compiled"][name].grad
                g = np.zeros(tuple(w.shape), spec.dtype) if g is None else g.numpy()
                n = grads["noise"][name].grad if f32 else None
                _close(g, w.grad.numpy(), rtol, f"gradient of {name} at batch {batch} (torch.compile)",
                       "mismatch-dynamo", n.numpy() if n is not None else None)
    finally:
        torch._dynamo.reset()


def _close_params(trainer, tnet, nnet, rtol, when: str, kind: str) -> None:
    """The Trainer's parameters against PyTorch's float64 ``tnet`` (``nnet``: PyTorch's float32
    module after the same steps, its rounding noise; ``None`` in float64)."""
    new = trainer.params
    noise = dict(nnet.named_parameters()) if nnet is not None else {}
    for n, p in tnet.named_parameters():
        _close(new[n], p.detach().numpy(), rtol, f"parameter {n} {when}", kind,
               noise[n].detach().numpy() if n in noise else None)


def _float64(tensors) -> list:
    """``tensors`` with the floating ones in float64 (the inputs of the float64 reference)."""
    return [t.double() if t.is_floating_point() else t for t in tensors]


def _torch_step(net, tensors, heads, reads, lr):
    """A copy of ``net`` after one PyTorch SGD step on :func:`_torch_loss` in training mode."""
    tnet = copy.deepcopy(net)
    tnet.train(True)
    opt = torch_sgd(tnet, lr)
    opt.zero_grad()
    loss = _torch_loss(_listed(tnet(*tensors)), heads, reads)
    if loss is not None:
        loss.backward()
    opt.step()
    return tnet


#: the weight decay of the SGD steps, in te_grad and in PyTorch
DECAY = 0.1


def torch_sgd(net, lr):
    import torch
    return torch.optim.SGD(net.parameters(), lr=lr, weight_decay=DECAY)


def check_seed(seed: int, compile_: bool = True, dynamo: bool = False) -> Outcome:
    """:func:`check` of :func:`generate` ``(seed)`` (what a failure's script calls)."""
    return check(generate(seed), compile_=compile_, dynamo=dynamo)


def script(spec: Spec, outcome: Outcome, dynamo: bool = False) -> str:
    """A Python script that rebuilds ``spec``'s module from its seed and reruns the checks."""
    detail = "\n".join("# " + line for line in outcome.detail.strip().splitlines()[-12:])
    body = "\n".join("# " + line for line in spec.describe().splitlines())
    return (f"# te_grad fuzz --torch: {outcome.kind}\n{detail}\n# the module:\n{body}\n"
            "from te_grad.tools.fuzz.torch_check import check_seed\n\n"
            f"print(check_seed({spec.seed}{', dynamo=True' if dynamo else ''}))\n")


def run(programs: int, seed: int = 0, out: Optional[TextIO] = None, compile_: bool = True,
        progress_every: int = 10, dynamo: bool = False) -> Dict[str, object]:
    """Check ``programs`` random modules; print the counts, the rejections by operator, the
    modules exercising each family, and a script per failure. Returns ``{"counts", "rejected",
    "families", "failures"}``."""
    out = sys.stdout if out is None else out
    counts: Counter = Counter()
    rejected: Counter = Counter()
    families: Counter = Counter()
    failures = []
    start = time.monotonic()
    for i in range(programs):
        spec = generate(seed * 1_000_003 + i)
        outcome = check(spec, compile_=compile_, dynamo=dynamo)
        counts[outcome.kind] += 1
        rejected.update(outcome.rejected_ops)
        families.update(outcome.families)
        if outcome.failed:
            failures.append((spec, outcome))
        if progress_every and (i + 1) % progress_every == 0:
            print(f"[{i + 1}/{programs}] {time.monotonic() - start:.0f} s, "
                  + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), file=out, flush=True)
    print(f"\n{programs} modules (seed {seed}) in {time.monotonic() - start:.0f} s", file=out)
    for kind in sorted(counts):
        print(f"  {kind:28s} {counts[kind]}", file=out)
    for op in sorted(rejected):
        print(f"  rejected by {op}: {rejected[op]}", file=out)
    for fam in FAMILIES:
        print(f"  modules with {fam}: {families[fam]}", file=out)
    for spec, outcome in failures:
        print(f"\n# --- module {spec.seed} ---\n{script(spec, outcome, dynamo)}", file=out)
    return {"counts": dict(counts), "rejected": dict(rejected), "families": dict(families),
            "failures": [spec.seed for spec, _ in failures]}
