"""Test-wide settings.

- The IR verifier runs between the stages of every pipeline the tests drive
  (``TE_GRAD_VERIFY=1``, see ``te_grad/verify.py``).
- The persistent kernel cache writes into a fresh temporary directory.
- ``TE_GRAD_REQUIRE_ALL=1`` (set by CI) turns every skipped test into a failure:
  the tests of optional parts (PyTorch, JAX, cross-compilation) may skip on a
  developer's machine that lacks them, never in CI.
"""
import os
import tempfile

import pytest

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
