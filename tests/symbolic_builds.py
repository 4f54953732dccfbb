"""Shared by the tests of ops and trainers on size variables: count the kernels te_grad
builds, and run them either with ``tg.build``'s own kernels on size variables (``"real"``,
skipped where this tree cannot build those yet) or with a stand-in (``"stand-in"``) that
binds the sizes at each call and runs an exact kernel of the specialized graph, so the
frontends' handling of symbolic signatures is tested on its own."""
import numpy as np
import pytest

import codegen
import te_grad as tg
import te_grad.autodiff as autodiff

_REAL_BUILD = codegen.build
_REAL_DIFFERENTIATE = autodiff.differentiate
_SUPPORTED = []


class StandInKernel:
    """A kernel on size variables made of exact kernels, one per size (built on first use)."""

    def __init__(self, outputs, inputs, **options):
        self.outputs, self.inputs, self.options = list(outputs), list(inputs), options
        self.size_vars = tg.sizes.graph_size_vars(self.outputs + self.inputs)
        self.exact = {}

    def __call__(self, *arrays, out=None):
        sizes = tg.sizes.bind_sizes([(t.name, t.shape, np.shape(a)) for t, a in zip(self.inputs, arrays)])
        return self._exact(sizes)(*arrays, out=out)

    def run_pointers(self, inputs, outputs, sizes=None):
        self._exact(tg.sizes.named_sizes(self.size_vars, sizes)).run_pointers(inputs, outputs)

    def _exact(self, sizes):
        key = tuple(sorted((v.name, n) for v, n in sizes.items()))
        if key not in self.exact:
            outs, new = tg.sizes.specialize(self.outputs, sizes)
            ins = [new[id(x)] if id(x) in new else
                   tg.placeholder(tg.sizes.concrete_shape(x.shape, sizes), dtype=x.dtype, name=x.name)
                   for x in self.inputs]
            self.exact[key] = _REAL_BUILD(outs, ins, **{k: v for k, v in self.options.items() if k != "wait"})
        return self.exact[key]

    def wait(self):
        return self


def symbolic_build_supported() -> bool:
    """Whether ``tg.build_vjp`` builds one kernel pair on size variables in this tree."""
    if not _SUPPORTED:
        n = tg.var("n")
        x = tg.placeholder((n, 3), name="x")
        y = tg.compute((n, 3), lambda i, j: tg.tanh(x[i, j]) * x[i, j], name="y")
        try:
            vjp = tg.build_vjp([y], [x])
            a = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
            got = vjp.forward(a)
            ok = np.allclose(got[0] if isinstance(got, tuple) else got, np.tanh(a) * a, rtol=1e-5)
        except Exception:  # noqa: BLE001 - any failure: not supported yet
            ok = False
        _SUPPORTED.append(ok)
    return _SUPPORTED[0]


def use_builds(monkeypatch, kind: str) -> dict:
    """Count te_grad's builds from now on (``{"symbolic": [...], "exact": [...]}``, the output
    names of each), with ``kind`` kernels on size variables (see the module docstring)."""
    if kind == "real" and not symbolic_build_supported():
        pytest.skip("tg.build on size variables is not in this tree yet")
    made = {"symbolic": [], "exact": []}

    def build(outputs, inputs, **options):
        outs = [outputs] if isinstance(outputs, tg.Tensor) else list(outputs)
        symbolic = tg.sizes.is_symbolic(outs + list(inputs))
        made["symbolic" if symbolic else "exact"].append([t.name for t in outs])
        if symbolic and kind == "stand-in":
            return StandInKernel(outs, inputs, **options)
        return _REAL_BUILD(outputs, inputs, **options)

    def differentiate(outputs, wrt, **options):
        outs = [outputs] if isinstance(outputs, tg.Tensor) else list(outputs)
        if kind == "stand-in" and tg.sizes.is_symbolic(outs):
            options["simplify"] = False  # the stand-in specializes the raw gradient per size
        return _REAL_DIFFERENTIATE(outputs, wrt, **options)

    monkeypatch.setattr(codegen, "build", build)
    monkeypatch.setattr(autodiff, "differentiate", differentiate)
    return made
