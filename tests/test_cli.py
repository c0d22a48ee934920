"""The CLI: `run` on the real MiniLM (its table and groups; errors are in test_cli_errors.py) and `launch`."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tvm_combiners.app.cli import main

SCRIPT_DIR = os.path.dirname(sys.executable)


def _row(out, label):
    line = next(line for line in out.splitlines() if line.startswith(label + " "))
    return line.split()


@pytest.mark.slow
def test_console_script_runs_the_default_bert():
    exe = shutil.which("tvm-combiners", path=SCRIPT_DIR)
    assert exe, "pip install -e . should have installed the tvm-combiners console script"
    proc = subprocess.run([exe, "run", "--repeat", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "paraphrase-MiniLM-L3-v2.onnx" in out and "ir relax" in out and "batch 1  seq 128" in out
    head = _row(out, "module")
    assert head[:2] == ["module", "#matmul"]
    baseline, combined = _row(out, "baseline"), _row(out, "combined")
    assert baseline[1] == "24" and combined[1] == "18"
    assert float(baseline[-1]) <= 1e-4 and float(combined[-1]) <= 1e-4
    assert "combined groups: 3 (combined as stack)" in out
    assert out.count("3 x matmul -> add: input (1, 128, 384), weights 3 x (384, 384), stacked [384, 384, 384]") == 3
    assert "[tvm-combiners] compiling combined for llvm" in proc.stderr  # progress lines


@pytest.mark.slow
def test_no_combine(capsys):
    assert main(["run", "--no-combine", "--repeat", "1", "--seq", "32"]) == 0
    out = capsys.readouterr().out
    assert "combined groups: 0" in out and "seq 32" in out
    assert re.search(r"^baseline\s+24\s", out, re.M) and "combined " not in out.split("combined groups")[0]


@pytest.mark.slow
def test_combine_as_concat_concatenates_equal_widths(capsys):
    assert main(["run", "--combine-as", "concat", "--repeat", "1", "--seq", "32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    baseline, combined = report["variants"]
    assert (baseline["ops"]["matmul"], combined["ops"]["matmul"]) == (24, 18)
    assert len(report["groups"]) == 3 and all("widths [384, 384, 384]" in g for g in report["groups"])
    assert report["combine_as"] == "concat"
    assert baseline["max_abs_diff"] <= 1e-4 and combined["max_abs_diff"] <= 1e-4


@pytest.mark.slow
def test_cuda_target_compiles_and_says_when_it_cannot_run(capsys):
    from tvm_combiners.compile.relax_runner import has_gpu

    assert main(["run", "--target", "cuda", "--repeat", "1", "--seq", "32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^combined\s+18\s", out, re.M)
    if not has_gpu():
        assert "no CUDA GPU here: compiled for cuda, not executed" in out


def test_launch_runs_every_rank():
    exe = shutil.which("tvm-combiners", path=SCRIPT_DIR)
    code = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(f'rank {c.Get_rank()} of {c.Get_size()}', flush=True)"
    proc = subprocess.run([exe, "launch", "-n", "2", "--timeout", "60", "--", "python", "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the ranks' stdout streams interleave through mpiexec: match the records, not the lines
    assert sorted(re.findall(r"rank (\d+) of (\d+)", proc.stdout)) == [("0", "2"), ("1", "2")], proc.stdout


def test_launch_passes_the_failing_exit_code_on():
    exe = shutil.which("tvm-combiners", path=SCRIPT_DIR)
    proc = subprocess.run([exe, "launch", "-n", "1", "--timeout", "60", "--", "sh", "-c", "exit 3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3


def test_run_imports_neither_mpi_nor_the_launcher(tmp_path):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    code = ("import sys; from tvm_combiners.app.cli import main; rc = main(['run', sys.argv[1]]); "
            "print(rc, sorted(m for m in sys.modules if 'mpi4py' in m or 'collectives' in m))")
    proc = subprocess.run([sys.executable, "-c", code, str(empty)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "2 []", proc.stderr


def test_launch_json_needs_an_example(capsys):
    assert main(["launch", "-n", "1", "--json", "--", "true"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc == {"ok": False, "error": {"file": None, "stage": "setup", "bad_input": True, "exit_code": 2,
                                          "message": "launch: --json needs --example (a command's output is its own)"}}
    assert captured.err == "tvm-combiners: error: launch: --json needs --example (a command's output is its own)\n"


def test_launch_example_takes_options_not_a_command(capsys):
    assert main(["launch", "-n", "2", "--example", "dp-train", "--", "python", "prog.py"]) == 2
    err = capsys.readouterr().err
    assert err == ("tvm-combiners: error: launch: --example dp-train runs the example itself: after '--' give only "
                   "its options (e.g. -- --help), not a command ('python')\n")


def test_launch_example_names_are_checked(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["launch", "-n", "2", "--example", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err  # argparse quotes the choices in some Python versions, not in others
    assert re.search(r"argument --example: invalid choice: 'nope' \(choose from '?dp-train'?, '?pipeline-bert'?, '?tp-bert'?\)", err), err


def test_example_command_runs_the_module_with_its_options():
    from tvm_combiners.app.examples import example_command

    assert example_command("pipeline-bert", ["--seq", "8"], "/tmp/r.json") == [
        "python", "-m", "tvm_combiners.app.examples.pipeline_bert", "--seq", "8", "--json-out", "/tmp/r.json"]
    with pytest.raises(ValueError, match="unknown example 'x': choose from dp-train, pipeline-bert, tp-bert"):
        example_command("x", [])
