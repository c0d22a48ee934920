"""The README's Relax and collectives examples, run as a user would run them."""

import re
import subprocess
import sys

import numpy as np
import pytest

from tvm_combiners.compile.relax_runner import run_vm
from tvm_combiners.models import example_inputs, run_onnxruntime


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
    example = readme_block("C.AllReduceCombiner()")
    shape, value = re.search(r"on 2 ranks: (\(.*?\)) (\S+) on both", example).groups()
    # each rank prints into its own file: two ranks sharing mpiexec's stdout can interleave mid-line
    own_stdout = ("import sys\nfrom mpi4py import MPI\n"
                  f"sys.stdout = open(f'{tmp_path}/rank{{MPI.COMM_WORLD.Get_rank()}}.txt', 'w')\n")
    prog = tmp_path / "prog.py"
    prog.write_text(own_stdout + example)
    cmd = [sys.executable, "-m", "tvm_combiners.collectives.runtime.launcher", "-n", "2", "--timeout", "240",
           "--", sys.executable, str(prog)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        printed = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert f"{rank} {shape} {value}" in printed, printed
