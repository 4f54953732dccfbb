"""``python -m te_grad.tools.fuzz [options]``: the same as ``python -m te_grad fuzz [options]``."""
import sys

from te_grad.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["fuzz"] + sys.argv[1:]))
