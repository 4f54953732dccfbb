"""Rich (HTML, LaTeX) display of te_grad objects in Jupyter; plain text stays the terminal form.

Each function returns an HTML string. The objects do not import this module: :func:`install`
gives their classes the ``_repr_html_`` (and tensors ``_repr_latex_``) that Jupyter calls,
and ``import te_grad`` runs it. So the IR core, the simplifier and the code generator know
nothing of notebooks, and this module sits above them all, just below the facade.
"""
from __future__ import annotations

import html

from .errors import UserError

_STYLE = ("font-family: var(--jp-code-font-family, monospace); font-size: 12px; "
          "white-space: pre; overflow-x: auto; margin: 0")


def _pre(text: str) -> str:
    return f'<pre style="{_STYLE}">{html.escape(text)}</pre>'


def _details(summary: str, body_html: str, open_: bool = False) -> str:
    return (f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>"
            f"{body_html}</details>")


def tensor_html(tensor) -> str:
    """A tensor: its formula, with the formulas it depends on collapsible."""
    from .printer import show
    lines = show(tensor).splitlines()
    head = f"<b>{html.escape(tensor.name)}</b>: {tensor.dtype}{list(tensor.shape)}"
    out = head + _pre(lines[-1])
    if len(lines) > 1:
        out += _details(f"{len(lines) - 1} tensors it depends on", _pre("\n".join(lines[:-1])))
    return out


def result_html(res) -> str:
    """A differentiation result: per input, the gradient and its exact cost, raw vs simplified."""
    from .printer import show
    from simplify import iterations

    def count(ts):  # None where a ragged loop's count depends on data
        try:
            return iterations(ts)
        except UserError:
            return None

    def fmt(n):  # an int, or a count in size variables (its closed form)
        return "depends on the data" if n is None else html.escape(f"{n:,}")

    forward = count(list(res.outputs))
    rows = []
    for x, g, raw in zip(res.inputs, res.gradients, res.raw):
        n_simp, n_raw = count(g), count(raw)
        saved = "" if n_simp is None or n_raw is None else _saved(n_raw, n_simp)
        rows.append(
            f"<tr><td><b>{html.escape(x.name)}</b></td>"
            f"<td style='text-align:left'>{_pre(show(g).splitlines()[-1])}</td>"
            f"<td>{fmt(n_simp)}</td><td>{fmt(n_raw)}</td><td>{saved}</td></tr>")
    table = ("<table><tr><th>input</th><th style='text-align:left'>gradient (simplified)</th>"
             "<th>iterations</th><th>raw VJP iterations</th><th>saved</th></tr>" + "".join(rows) + "</table>")
    outs = ", ".join(html.escape(y.name) for y in res.outputs)
    raw_text = "\n\n".join(show(r) for r in res.raw)
    return (f"<b>gradients of {outs}</b> (forward: {fmt(forward)} innermost iterations)" + table
            + _details("raw vector-Jacobian products (before isl)", _pre(raw_text)))


def _saved(n_raw, n_simp) -> str:
    """``raw / simplified`` for int counts; counts in size variables print as functions."""
    if isinstance(n_raw, int) and isinstance(n_simp, int):
        return f"{n_raw / max(n_simp, 1):,.0f}x"
    return html.escape(f"({n_raw}) / ({n_simp})")


def kernel_html(kernel) -> str:
    """A compiled kernel: its loop nest, with LLVM IR and assembly collapsible."""
    return (f"<b>{html.escape(repr(kernel))}</b>" + _pre(kernel.loops)
            + _details("LLVM IR (optimized)", _pre(kernel.llvm_ir))
            + _details("assembly", _pre(kernel.asm)))


def text_html(title: str, text: str) -> str:
    return f"<b>{html.escape(title)}</b>" + _pre(text)


def _tensor_latex(tensor):
    """The tensor's own formula as a LaTeX equation (sympy renders it)."""
    from .symbolic import latex
    if tensor.is_placeholder:
        return None
    return "$$" + latex(tensor, dependencies=False) + "$$"


def _domain_html(domain) -> str:
    return text_html(f"iteration domain of {domain.tensor.name}", repr(domain).split(": ", 1)[1])


def install():
    """Give te_grad's objects their notebook forms: tensors (HTML and LaTeX), differentiation
    results, compiled kernels and iteration domains."""
    from codegen.kernel import Kernel
    from simplify.domain import IterationDomain
    from .autodiff import DifferentiationResult
    from .ir import Tensor
    Tensor._repr_html_ = tensor_html
    Tensor._repr_latex_ = _tensor_latex
    DifferentiationResult._repr_html_ = result_html
    Kernel._repr_html_ = kernel_html
    IterationDomain._repr_html_ = _domain_html
