"""The benchmark of te_grad against PyTorch and JAX: ``python benchmarks/bench.py --help``.

The same as ``python -m te_grad bench``; the code lives in ``te_grad/tools/benchmark.py``.
"""
import sys

from te_grad.tools.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
