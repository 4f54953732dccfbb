"""Test-wide settings.

- The IR verifier runs between the stages of every pipeline the tests drive
  (``TE_GRAD_VERIFY=1``, see ``te_grad/verify.py``).
- The persistent kernel cache writes into a fresh temporary directory, one for each
  process (every pytest-xdist worker of ``pytest -n auto`` has its own).
- ``TE_GRAD_REQUIRE_ALL=1`` (set by CI) turns every skipped test, and every file skipped
  whole at collection, into a failure:
  the tests of optional parts (PyTorch, JAX, cross-compilation) may skip on a
  developer's machine that lacks them, never in CI.
- Where tests skipped for a missing optional package, the run ends with one line
  naming the packages and the ``pip install -e ".[...]"`` extras that bring them.
- The tests mirror the packages (``tests/simplify/``, ``tests/codegen/``, ...). pytest puts
  ``tests/`` on ``sys.path`` (for this file and the shared helpers), where those folders
  would read as namespace packages named ``simplify`` and ``codegen``; the repository root
  goes first, so ``import simplify`` is the package, however te_grad was installed.
  ``tests/codegen/`` goes last, so the kernel checks of ``test_codegen`` are importable from
  any folder, whichever files a run collects.
"""
import os
import re
import sys
import tempfile
from collections import Counter

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [_ROOT]:
    sys.path.insert(0, _ROOT)
_CODEGEN_TESTS = os.path.join(_ROOT, "tests", "codegen")
if _CODEGEN_TESTS not in sys.path:
    sys.path.append(_CODEGEN_TESTS)

os.environ.setdefault("TE_GRAD_VERIFY", "1")
# the persistent kernel cache of the tests lives in a directory of their own, new each run
os.environ["TE_GRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="te_grad_test_cache_")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("TE_GRAD_REQUIRE_ALL") == "1" and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped in CI, where every test must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A whole file skipped at collection (``pytest.importorskip`` at module level) fails
    too under ``TE_GRAD_REQUIRE_ALL=1``: the item hook above never sees such a skip."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("TE_GRAD_REQUIRE_ALL") == "1":
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"{collector.nodeid} skipped in CI, where every test must run: {reason}"


#: optional packages the tests import, and the extra of setup.cfg that installs each
EXTRAS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "sklearn": "examples", "matplotlib": "test",
          "nbclient": "test", "nbformat": "test", "ipykernel": "test", "hypothesis": "test"}
_MISSING = re.compile(r"could not import '([\w.]+)'|needs ([\w.]+) \(pip install|([\w.]+) is not installed")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")


def missing_optional_line(reasons) -> str:
    """One line naming the optional packages whose absence skipped tests (``reasons``: the
    skip messages) and the extras that install them; "" when none did."""
    missing = Counter()
    for reason in reasons:
        found = _MISSING.search(reason)
        if found:
            missing[next(g for g in found.groups() if g).split(".")[0]] += 1
    if not missing:
        return ""
    extras = sorted({EXTRAS[m] for m in missing if m in EXTRAS})
    parts = ", ".join(f"{m} ({n} skipped)" for m, n in sorted(missing.items()))
    unknown = sorted(m for m in missing if m not in EXTRAS)
    fix = " and ".join(([f'pip install -e ".[{",".join(extras)}]"'] if extras else [])
                       + ([f"pip install {' '.join(unknown)}"] if unknown else []))
    return f"te_grad: tests skipped for missing optional packages: {parts}; to run them: {fix}"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    yield  # after pytest's own summary sections: the line is the last before the totals
    line = missing_optional_line(_skip_reason(r) for r in terminalreporter.stats.get("skipped", []))
    if line:
        terminalreporter.write_sep("-", "optional parts missing")
        terminalreporter.write_line(line, yellow=True, bold=True)
