"""tvm_combiners.startup: TVM's import without torch (the CLI's start-up, the tests' processes)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed here")


def _python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # without the tests' sitecustomize
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_tvms_own_import_loads_torch_where_it_is_installed():
    """Why the module exists: without it, importing TVM imports torch."""
    proc = _python("import sys, tvm\nprint('torch' in sys.modules)")
    assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr[-2000:]


def test_tvm_imports_without_torch_and_torch_still_imports_after():
    proc = _python("import sys\n"
                   "from tvm_combiners.startup import keep_torch_out_of_tvm_import\n"
                   "keep_torch_out_of_tvm_import()\n"
                   "import tvm\nfrom tvm import relax\n"
                   "print('torch' in sys.modules)\n"
                   "import torch\nprint(int(torch.ones(3).sum()))")
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "3"], proc.stderr[-2000:]


def test_the_cli_leaves_torch_out_of_tvms_import():
    proc = _python("import sys\nfrom tvm_combiners.app.cli import main\n"
                   "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                   "import tvm\nprint('torch' in sys.modules, file=sys.stderr)")
    assert proc.returncode == 0 and proc.stderr.split()[-1:] == ["False"], proc.stderr[-2000:]


def test_the_examples_ranks_leave_torch_out_of_tvms_import():
    proc = _python("import sys\nfrom tvm_combiners.app.examples import tp_bert\n"
                   "try:\n    tp_bert.main(['--help'])\nexcept SystemExit:\n    pass\n"
                   "print('tvm' in sys.modules, 'torch' in sys.modules, file=sys.stderr)")
    assert proc.returncode == 0 and proc.stderr.split()[-2:] == ["True", "False"], proc.stderr[-2000:]
