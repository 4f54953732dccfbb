"""``python -m te_grad ...``: the command line (see :mod:`te_grad.tools.cli`)."""
import sys

from te_grad.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
