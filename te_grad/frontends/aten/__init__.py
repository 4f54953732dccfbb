"""The ATen operator table: one rule per operator, mapping it onto te_grad tensors.

``RULES["aten.relu.default"]`` is a function ``rule(t, *args, **kwargs)`` of the
:class:`~te_grad.frontends.translate.Translator` ``t`` and the node's arguments with te_grad
values substituted (tensors, numbers, size expressions, lists of them); it returns the node's
value. Rules use ``te_grad.nn`` where an operator exists there and the DSL otherwise, and
follow PyTorch's semantics (the translator checks every result's rank, extents and dtype
against the captured program's). The operators are those of PyTorch's core ATen opset after
``torch.export``'s decompositions, plus the few composite ones kept whole
(:data:`KEEP`), because te_grad has a better form of them than their decomposition.

The rules live in one module per family, each stating the math of its less obvious rules:

- :mod:`.table`: :data:`RULES`, :data:`KEEP`, :func:`~.table.rule` (with the float promotion of
  arithmetic operands) and the helpers every family shares;
- :mod:`.elementwise`: arithmetic, comparisons, logic, float functions, activations, casts;
- :mod:`.creation`: ``full``, ``empty``, ``arange``, symbolic sizes;
- :mod:`.layout`: views, slices, concatenation, padding, flips, rolls, repeats;
- :mod:`.indexing`: ``gather``, ``index_select``, ``index``, ``embedding``;
- :mod:`.contractions`: matrix products, ``linear``, convolutions, attention;
- :mod:`.reductions`: sums, means, norms, extrema, variances, cumulative sums, softmax;
- :mod:`.losses`: ``nll_loss``, ``mse_loss``;
- :mod:`.normalization`: batch, layer and group norm;
- :mod:`.resampling`: pooling and upsampling;
- :mod:`.dropout`: ``native_dropout`` and ``bernoulli``, drawn from the step's seed.

Importing this package imports every family, which registers its rules.
"""
from . import contractions, creation, dropout, elementwise, indexing, layout, losses
from . import normalization, reductions, resampling
from .table import KEEP, RULES, rule

__all__ = ["KEEP", "RULES", "rule", "contractions", "creation", "dropout", "elementwise", "indexing", "layout",
           "losses", "normalization", "reductions", "resampling"]
