"""The LLVM corpus: a fingerprint of the code te_grad generates, to show a refactoring changes none.

``python -m te_grad.tools.corpus OUT.json`` builds 140 kernels (the 18 ops of the reference
suite in float32 and float64, forward and forward with gradients, and every formulation of
:mod:`te_grad.formulations` at both sizes, forward and with gradients) and writes the SHA-256
of each kernel's optimized LLVM IR. Run it on two trees (with ``TE_GRAD_CACHE=0``, so no
kernel comes from the disk cache) and compare the files: identical hashes mean identical
code. ``--normalize`` first inlines the attribute groups and drops the function attribute
``"min-legal-vector-width"`` (which follows the vector blocks a stage is marked with), so a
change that only corrects that attribute still compares equal.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys

import te_grad as tg
from te_grad.formulations import FORMULATIONS
from te_grad.suite import SUITE


def normalized(text: str) -> str:
    """``text`` with its attribute groups inlined and the vector-width attribute dropped."""
    groups = dict(re.findall(r"^attributes (#\d+) = \{ (.*) \}$", text, re.M))
    text = re.sub(r"^attributes #\d+ = .*\n", "", text, flags=re.M)
    text = re.sub(r"(#\d+)", lambda m: "{" + groups.get(m.group(1), m.group(1)) + "}", text)
    return re.sub(r' ?"min-legal-vector-width"="\d+"', "", text)


def workloads():
    """``(name, outputs, inputs)`` of every kernel of the corpus, in a fixed order."""
    for name, make in SUITE.items():
        for dt in ("float32", "float64"):
            w = make(dt)
            args = w.inputs + list(w.data)
            yield f"suite/{name}/{dt}/fwd", [w.output], args
            yield f"suite/{name}/{dt}/bwd", [w.output] + list(tg.gradient(w.output, w.inputs)), args
    for forms in FORMULATIONS.values():
        for name, make in forms.items():
            for small in (True, False):
                w = make("float32", small=small)
                args = w.inputs + list(w.data)
                yield f"form/{name}/{small}/fwd", [w.output], args
                yield f"form/{name}/{small}/bwd", [w.output] + list(tg.gradient(w.output, w.inputs)), args


def corpus(normalize: bool = False) -> dict:
    out = {}
    for name, outputs, inputs in workloads():
        text = tg.build(outputs, inputs, threads=1).llvm_ir
        out[name] = hashlib.sha256((normalized(text) if normalize else text).encode()).hexdigest()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m te_grad.tools.corpus", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the JSON file of hashes to write")
    parser.add_argument("--normalize", action="store_true", help="ignore the vector-width attribute")
    args = parser.parse_args(argv)
    hashes = corpus(args.normalize)
    with open(args.out, "w") as f:
        json.dump(hashes, f, indent=0, sort_keys=True)
    print(f"{len(hashes)} kernels hashed into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
