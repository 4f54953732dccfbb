"""Rich (HTML) display of te_grad objects in Jupyter; plain text stays the terminal form.

Each function returns an HTML string; the objects' ``_repr_html_`` call them.
"""
from __future__ import annotations

import html

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
    from . import iterations
    forward = iterations(list(res.outputs))
    rows = []
    for x, g, raw in zip(res.inputs, res.gradients, res.raw):
        n_simp, n_raw = iterations(g), iterations(raw)
        rows.append(
            f"<tr><td><b>{html.escape(x.name)}</b></td>"
            f"<td style='text-align:left'>{_pre(show(g).splitlines()[-1])}</td>"
            f"<td>{n_simp:,}</td><td>{n_raw:,}</td><td>{n_raw / max(n_simp, 1):,.0f}x</td></tr>")
    table = ("<table><tr><th>input</th><th style='text-align:left'>gradient (simplified)</th>"
             "<th>iterations</th><th>raw VJP iterations</th><th>saved</th></tr>" + "".join(rows) + "</table>")
    outs = ", ".join(html.escape(y.name) for y in res.outputs)
    raw_text = "\n\n".join(show(r) for r in res.raw)
    return (f"<b>gradients of {outs}</b> (forward: {forward:,} innermost iterations)" + table
            + _details("raw vector-Jacobian products (before isl)", _pre(raw_text)))


def kernel_html(kernel) -> str:
    """A compiled kernel: its loop nest, with LLVM IR and assembly collapsible."""
    return (f"<b>{html.escape(repr(kernel))}</b>" + _pre(kernel.loops)
            + _details("LLVM IR (optimized)", _pre(kernel.llvm_ir))
            + _details("assembly", _pre(kernel.asm)))


def text_html(title: str, text: str) -> str:
    return f"<b>{html.escape(title)}</b>" + _pre(text)
