"""An optional feature whose packages are missing says, in one line, which extra installs them."""

import importlib.util
import subprocess
import sys

from tvm_combiners.app.cli import main
from tvm_combiners.errors import MissingExtra

MPI_LINE = "pip install 'tvm_combiners[mpi]' (or: pip install mpi4py mpich)"


def test_missing_extra_names_the_extra_and_the_packages():
    err = MissingExtra("the collectives runtime", "mpi", ["mpi4py", "mpich"])
    assert str(err) == f"the collectives runtime needs mpi4py, mpich: {MPI_LINE}"
    assert isinstance(err, ImportError) and err.extra == "mpi"


def test_the_runtime_without_mpi4py_names_the_mpi_extra():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "from tvm_combiners.collectives.runtime import rank\n"
            "try:\n    rank()\nexcept ImportError as err:\n    print(err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout == f"the collectives runtime needs mpi4py, mpich: {MPI_LINE}\n", proc.stderr


def test_launch_without_mpi4py_is_one_line_before_any_rank_starts(capsys, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a))
    (tmp_path / "prog.py").write_text("print('ran')\n")
    code = main(["launch", "-n", "2", "--timeout", "30", "--", "python", str(tmp_path / "prog.py")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"tvm-combiners: error: launch: python ranks run under mpi4py, which is not installed: {MPI_LINE}"]
