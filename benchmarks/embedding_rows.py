"""The embedding workload's gradient, dense and as rows (tg.row_gradient), next to PyTorch.

    python benchmarks/embedding_rows.py [--threads 2]

The dense gradient of a 50000x128 table read at 4096 rows writes 25.6 MB,
mostly zeros: that write bounds its time on any system. The row gradient
(ids and rows, PyTorch's ``sparse=True``) computes only the 4096 rows.
Prints ms, backward / forward ratios, and checks every gradient against
PyTorch's dense one.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import te_grad as tg  # noqa: E402
from te_grad.tools.benchmark import Timer, pin_threads, rel_err  # noqa: E402
from te_grad.suite import workload  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    pin_threads(args.threads)
    w = workload("embedding")
    (table,), (ids,) = w.inputs, list(w.data)
    rng = np.random.default_rng(0)
    table_v = rng.standard_normal(table.shape).astype("float32")
    ids_v = w.data[ids](rng)
    head_ph = tg.placeholder(w.output.shape, name="head")
    head = rng.standard_normal(w.output.shape).astype("float32")
    (dense,) = tg.gradient(w.output, [table], head=head_ph)
    rows = tg.row_gradient(dense)
    fwd = tg.build([w.output], inputs=[table, ids], threads=args.threads)
    bwd_dense = tg.build([dense], inputs=[table, ids, head_ph], threads=args.threads)
    bwd_rows = tg.build([rows.ids, rows.rows], inputs=[table, ids, head_ph], threads=args.threads)
    fns = {"te_grad fwd": lambda: fwd(table_v, ids_v),
           "te_grad bwd dense": lambda: bwd_dense(table_v, ids_v, head),
           "te_grad bwd rows": lambda: bwd_rows(table_v, ids_v, head)}
    checks = {}
    try:
        import torch
        torch.set_num_threads(args.threads)
        F = torch.nn.functional
        tt, ti, th = torch.from_numpy(table_v).requires_grad_(), torch.from_numpy(ids_v), torch.from_numpy(head)

        def torch_grad(sparse):
            return torch.autograd.grad(F.embedding(ti, tt, sparse=sparse), tt, th)[0]

        def torch_fwd():
            with torch.no_grad():
                return F.embedding(ti, tt)

        want = torch_grad(False).numpy()
        fns.update({"torch fwd": torch_fwd, "torch fwd+bwd dense": lambda: torch_grad(False),
                    "torch fwd+bwd sparse": lambda: torch_grad(True)})
        checks["torch sparse"] = rel_err(torch_grad(True).to_dense().numpy(), want)
    except ImportError:
        want = tg.evaluate([dense], {table: table_v, ids: ids_v, head_ph: head})[0]
        print("PyTorch is not installed: checking against the reference evaluator")
    checks["te_grad dense"] = rel_err(bwd_dense(table_v, ids_v, head), want)
    checks["te_grad rows"] = rel_err(rows.to_dense(*bwd_rows(table_v, ids_v, head)), want)
    times = Timer(warmup=3, min_runs=20, min_time=1.0)(fns)
    ms = {k: v["ms"] for k, v in times.items()}
    print(f"embedding: table {table.shape}, {ids.shape[0]} ids, float32, {args.threads} threads")
    for k, v in ms.items():
        print(f"  {k:24s} {v:8.3f} ms")
    f = ms["te_grad fwd"]
    print(f"  te_grad bwd / fwd: dense {ms['te_grad bwd dense'] / f:.2f}, rows {ms['te_grad bwd rows'] / f:.2f}")
    if "torch fwd" in ms:
        pf = ms["torch fwd"]
        for kind in ("dense", "sparse"):
            print(f"  torch bwd / fwd ({kind}, bwd = fwd+bwd - fwd): "
                  f"{(ms[f'torch fwd+bwd {kind}'] - pf) / pf:.2f}")
        print(f"  te_grad rows / torch sparse backward: "
              f"{ms['te_grad bwd rows'] / (ms['torch fwd+bwd sparse'] - pf):.2f}")
    ok = all(err <= 1e-3 for err in checks.values())
    print("  checks: " + ", ".join(f"{k} {v:.1e}" for k, v in checks.items()) + (" PASS" if ok else " FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
