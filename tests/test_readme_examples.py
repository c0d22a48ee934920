"""The README's Relax and collectives examples, run as a user would run them."""

import re
import subprocess
import sys

import numpy as np
import pytest

from tvm_combiners.models import example_inputs, run_onnxruntime
from tvm_combiners.relax.runner import run_vm


@pytest.mark.slow
def test_the_relax_examples_compile_the_default_model_and_print_what_the_readme_shows(readme_block, capsys):
    scope: dict = {}
    exec(readme_block("import_relax(model)"), scope)
    inputs = example_inputs(scope["model"])
    for ours, reference in zip(run_vm(scope["executable"], list(inputs.values()), "llvm"),
                               run_onnxruntime(scope["model"], inputs), strict=True):
        np.testing.assert_allclose(ours, reference, atol=1e-4)
    usage = readme_block("def big_enough")
    exec(usage, scope)
    shown = [line.split("# ", 1)[1] for line in usage.splitlines() if line.startswith("# ")]
    printed = capsys.readouterr().out.splitlines()
    assert shown and all(line in printed for line in shown), printed


@pytest.mark.slow
def test_the_collectives_example_prints_the_same_result_on_both_ranks(readme_block, tmp_path):
    prog = tmp_path / "prog.py"
    example = readme_block("C.AllReduceCombiner()")
    prog.write_text(example)
    shape, value = re.search(r"on 2 ranks: (\(.*?\)) (\S+) on both", example).groups()
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launch", "-n", "2", "--timeout", "240",
           "--", sys.executable, str(prog)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    printed = sorted(line for line in proc.stdout.splitlines() if line[:2] in ("0 ", "1 "))
    assert printed == [f"0 {shape} {value}", f"1 {shape} {value}"], proc.stdout[-2000:]
