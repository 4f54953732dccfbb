"""te_grad's tools, above the library: they use it the way a user does (through the facade
``te_grad`` and the reference evaluator), and nothing in the library imports them.

- :mod:`te_grad.tools.cli`: the command line, ``python -m te_grad demo | show | bench | fuzz | digits``;
- :mod:`te_grad.tools.benchmark`: te_grad against PyTorch and JAX on the reference suite;
- :mod:`te_grad.tools.plot`: figures of domains, iteration counts and benchmark ratios (matplotlib);
- :mod:`te_grad.tools.fuzz`: random programs, every stage checked against the others;
- :mod:`te_grad.tools.apidoc`: docs/API.md from the docstrings;
- :mod:`te_grad.tools.corpus`: hashes of the LLVM IR of 132 kernels, to show a change leaves the code alone.
"""
