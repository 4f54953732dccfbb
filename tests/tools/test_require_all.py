"""tests/conftest.py under TE_GRAD_REQUIRE_ALL=1 (what CI sets): a skipped test fails, and so
does a test file skipped whole at collection (a module-level importorskip of a missing
optional package); without it both are skips."""
import os
import pathlib
import shutil
import subprocess
import sys

CONFTEST = pathlib.Path(__file__).resolve().parents[1] / "conftest.py"


def _run(tmp_path, require_all: bool):
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    shutil.copy(CONFTEST, tests / "conftest.py")
    (tests / "test_missing.py").write_text('import pytest\npytest.importorskip("no_such_module_te_grad")\n\n'
                                           'def test_x():\n    pass\n')
    (tests / "test_skips.py").write_text('import pytest\n\ndef test_y():\n    pytest.skip("optional part")\n\n'
                                         'def test_z():\n    pass\n')
    env = dict(os.environ, TE_GRAD_REQUIRE_ALL="1" if require_all else "0")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def test_skips_fail_in_ci_and_stay_skips_elsewhere(tmp_path):
    ci = _run(tmp_path, True)
    assert ci.returncode != 0, ci.stdout
    assert "test_missing.py skipped in CI, where every test must run" in ci.stdout, ci.stdout
    local = _run(tmp_path, False)
    assert local.returncode == 0, local.stdout
    assert "1 passed, 2 skipped" in local.stdout, local.stdout
