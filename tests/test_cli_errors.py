"""`tvm-combiners run` on broken input: one line on stderr, a non-zero exit, never a traceback.

Every broken file is built here with onnx.helper; the tiny models compile in well under a second.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_combiners.app.cli import main
from tvm_combiners.models.loader import cpu_threads

ERROR = "tvm-combiners: error: "


def _save(graph, path, opset=17, **kw):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # onnx >= 1.17 writes IR 10+, which older onnxruntime builds reject
    onnx.save(model, str(path), **kw)
    return path


def parallel_matmuls(path, **kw):
    """x @ w1 + b1 and x @ w2 + b2: two sibling matmuls the combiner merges."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w1", (8, 16)), ("b1", (16,)), ("w2", (8, 4)), ("b2", (4,))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["y1"]),
             helper.make_node("MatMul", ["x", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["y2"])]
    graph = helper.make_graph(nodes, "parallel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y1", TensorProto.FLOAT, ["batch", 16]),
                               helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["batch", 4])], inits)
    return _save(graph, path, **kw)


def det_model(path):
    """Det: onnxruntime runs it, neither of TVM's ONNX frontends has a converter for it."""
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "det",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])])
    return _save(graph, path)


def position_model(path, positions=16):
    """A BERT-like embedding: token table plus a position table indexed by range(sequence length)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "word_embeddings.weight"),
             numpy_helper.from_array(rng.standard_normal((positions, 8)).astype(np.float32),
                                     "embeddings.position_embeddings.weight"),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero")]
    nodes = [helper.make_node("Gather", ["word_embeddings.weight", "input_ids"], ["tokens"]),
             helper.make_node("Shape", ["input_ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
             helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
             helper.make_node("Gather", ["embeddings.position_embeddings.weight", "positions"], ["pos"]),
             helper.make_node("Add", ["tokens", "pos"], ["y"])]
    graph = helper.make_graph(nodes, "embeddings",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 8])], inits)
    return _save(graph, path)


def _run(capsys, *argv):
    code = main(["run", *map(str, argv), "--repeat", "1"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith(ERROR)]
    assert len(errors) <= 1, err
    return code, out, errors[0][len(ERROR):] if errors else None


def test_not_onnx(capsys, tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("hello, this is not a model\n")
    assert _run(capsys, path) == (2, "", f"{path}: load: not an ONNX file (27 bytes; protobuf: Error parsing message "
                                         "with type 'onnx.ModelProto': Wire format was corrupt)")


def test_empty_file(capsys, tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    assert _run(capsys, path) == (2, "", f"{path}: load: empty file (0 bytes), not an ONNX model")


def test_truncated_file(capsys, tmp_path):
    data = parallel_matmuls(tmp_path / "whole.onnx").read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    assert _run(capsys, path) == (2, "", f"{path}: load: truncated or corrupt ONNX file ({len(data) // 2} bytes; "
                                         "protobuf: Error parsing message with type 'onnx.ModelProto': "
                                         "Wire format was corrupt)")


def test_missing_file(capsys, tmp_path):
    assert _run(capsys, tmp_path / "missing.onnx") == (2, "", f"{tmp_path / 'missing.onnx'}: load: ONNX model not found")


def test_directory_is_not_a_model(capsys, tmp_path):
    assert _run(capsys, tmp_path) == (2, "", f"{tmp_path}: load: not a file")


def test_missing_external_data(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                            location="ext.weights", size_threshold=0)
    (tmp_path / "ext.weights").unlink()
    assert _run(capsys, path) == (2, "", f"{path}: load: external data file 'ext.weights' of tensor 'w1' not found "
                                         f"(looked for {tmp_path / 'ext.weights'})")


def test_short_external_data(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                            location="ext.weights", size_threshold=0)
    data = (tmp_path / "ext.weights").read_bytes()
    (tmp_path / "ext.weights").write_bytes(data[:100])
    assert _run(capsys, path) == (2, "", f"{path}: load: external data file 'ext.weights' is too short for tensor "
                                         "'w1': 100 bytes, the tensor ends at byte 512")


def test_external_data_present_runs(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                            location="ext.weights", size_threshold=0)
    code, out, error = _run(capsys, path, "--batch", "2")
    assert (code, error) == (0, None) and "combined groups: 1" in out


def test_unknown_opset(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "future.onnx", opset=99)
    newest = onnx.defs.onnx_opset_version()
    assert _run(capsys, path) == (2, "", f"{path}: load: unknown ONNX opset 99 (onnx {onnx.__version__} knows opsets "
                                         f"1 to {newest})")


def test_checker_rejects(capsys, tmp_path):
    graph = helper.make_graph([helper.make_node("Frob", ["x"], ["y"], domain="com.example")], "custom",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = _save(graph, tmp_path / "custom.onnx")
    assert _run(capsys, path) == (2, "", f"{path}: load: invalid ONNX model: No opset import for domain 'com.example'")


def test_onnxruntime_rejects(capsys, tmp_path):
    import onnxruntime

    graph = helper.make_graph([helper.make_node("Add", ["x", "i"], ["y"])], "mixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    path = _save(graph, tmp_path / "mixed.onnx")
    assert _run(capsys, path) == (2, "", f"{path}: prepare: onnxruntime {onnxruntime.__version__} rejects the model: "
                                         "Type Error: Type parameter (T) of Optype (Add) bound to different types "
                                         "(tensor(float) and tensor(int64) in node ().")


def test_onnxruntime_fails_on_the_example_inputs(capsys, tmp_path):
    """Token ids shifted past a 3-row table: only running the model finds it (the reference stage)."""
    inits = [numpy_helper.from_array(np.ones((3, 4), np.float32), "table"),
             numpy_helper.from_array(np.array(5, np.int64), "five")]
    nodes = [helper.make_node("Add", ["ids", "five"], ["shifted"]), helper.make_node("Gather", ["table", "shifted"], ["y"])]
    graph = helper.make_graph(nodes, "lookup", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 4])], inits)
    path = _save(graph, tmp_path / "lookup.onnx")
    assert _run(capsys, path, "--seq", "4") == (
        2, "", f"{path}: reference: onnxruntime fails to run the model on inputs ids (1, 4): Non-zero status code returned "
               "while running Gather node. Name:'' Status Message: indices element out of data bounds, idx=855 must be "
               "within the inclusive range [-3,2]")


def test_op_the_frontend_does_not_support(capsys, tmp_path):
    path = det_model(tmp_path / "det.onnx")
    assert _run(capsys, path) == (2, "", f"{path}: import: TVM's Relax ONNX frontend does not support the op Det")


def test_seq_beyond_the_position_embeddings(capsys, tmp_path):
    path = position_model(tmp_path / "emb.onnx", positions=16)
    assert _run(capsys, path, "--seq", "17") == (
        2, "", f"{path}: prepare: seq 17 is beyond the model's 16 positions "
               "(position embedding table 'embeddings.position_embeddings.weight')")
    code, out, error = _run(capsys, path, "--seq", "16", "--no-combine")
    assert (code, error) == (0, None) and "seq 16" in out


@pytest.mark.slow
def test_seq_beyond_minilm_positions(capsys):
    from tvm_combiners.models import default_model_path

    path = default_model_path()
    assert _run(capsys, "--seq", "513") == (
        2, "", f"{path}: prepare: seq 513 is beyond the model's 512 positions "
               "(position embedding table 'model.0.auto_model.embeddings.position_embeddings.weight')")


def test_launch_that_cannot_be_imported_is_one_line(capsys, monkeypatch):
    import tvm_combiners.app.cli as cli

    def missing():
        raise ImportError("No module named 'mpi4py'")

    monkeypatch.setitem(cli.COMMANDS, "launch", cli.Command("launch", missing))
    assert main(["launch", "-n", "2", "--", "true"]) == 2
    assert capsys.readouterr().err == f"{ERROR}launch is unavailable in this environment: No module named 'mpi4py'\n"


def test_bad_sizes(capsys):
    assert _run(capsys, "--batch", "0") == (2, "", "--batch must be a positive integer, got 0")
    assert _run(capsys, "--seq", "-3") == (2, "", "--seq must be a positive integer, got -3")
    # review: a 20-digit --seq was a ValueError reported as our bug (exit 1)
    assert _run(capsys, "--seq", "99999999999999999999") == (
        2, "", "--seq must be at most 2147483647, got 99999999999999999999")


def test_sizes_beyond_memory_are_bad_input(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "m.onnx")
    assert main(["run", str(path), "--batch", "2000000000", "--ir", "relax"]) == 2  # x 8 float64: 128 GB
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"{ERROR}{path}: prepare: cannot prepare the model: out of memory (Unable to allocate ")
    assert "a bug in tvm-combiners" not in err


def test_relay_in_the_main_environment_says_what_to_use(capsys):
    import tvm

    try:
        import tvm.relay  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("this TVM has Relay")
    assert _run(capsys, "--ir", "relay") == (
        2, "", f"--ir relay needs a TVM build with Relay (upstream <= 0.19 or hhb-tvm); this environment has TVM "
               f"{tvm.__version__} without it: use --ir relax here, or the Relay environment (.venv-relay/bin/tvm-combiners)")


def test_default_ir_is_relax_here(capsys, tmp_path):
    code, out, error = _run(capsys, parallel_matmuls(tmp_path / "p.onnx"), "--no-combine")
    assert (code, error) == (0, None) and " ir relax " in out


def _boom(*args):
    raise KeyError("boom")


def test_internal_error_names_the_stage_and_exits_1(capsys, tmp_path, monkeypatch):
    from tvm_combiners.app.backends.relax import RelaxBackend

    monkeypatch.setattr(RelaxBackend, "combine", _boom)
    path = parallel_matmuls(tmp_path / "p.onnx")
    assert _run(capsys, path) == (1, "", f"{path}: combine: internal error in the combiner passes: KeyError: 'boom' "
                                         "(a bug in tvm-combiners: rerun with --debug for the traceback)")


def test_debug_shows_the_traceback(capsys, tmp_path, monkeypatch):
    from tvm_combiners.app.backends.relax import RelaxBackend

    monkeypatch.setattr(RelaxBackend, "combine", _boom)
    path = parallel_matmuls(tmp_path / "p.onnx")
    assert main(["run", str(path), "--debug"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert "Traceback (most recent call last):" in err and "KeyError: 'boom'" in err
    assert any("in _boom" in line for line in err)
    assert err[-1].startswith(f"{ERROR}{path}: combine: internal error")  # the one line still comes last


def test_interrupt_is_one_line(capsys, tmp_path, monkeypatch):
    from tvm_combiners.app.backends.relax import RelaxBackend

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(RelaxBackend, "combine", interrupt)
    assert main(["run", str(parallel_matmuls(tmp_path / "p.onnx")), "--json"]) == 130
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == "tvm-combiners: error: interrupted"
    assert json.loads(out)["error"]["exit_code"] == 130


def test_console_script_prints_no_traceback(tmp_path):
    exe = shutil.which("tvm-combiners", path=os.path.dirname(sys.executable))
    assert exe, "pip install -e . should have installed the tvm-combiners console script"
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    proc = subprocess.run([exe, "run", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"[tvm-combiners] loading {path}",
                                        f"{ERROR}{path}: load: empty file (0 bytes), not an ONNX model"]
    assert "mpi4py" not in proc.stderr


# --json ---------------------------------------------------------------------------------------

def test_json_report(capsys, tmp_path):
    path = parallel_matmuls(tmp_path / "p.onnx")
    assert main(["run", str(path), "--json", "--batch", "3", "--repeat", "2"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # the whole of stdout is one document
    assert "[tvm-combiners] compiling combined for llvm" in err  # progress stays on stderr
    assert {k: doc[k] for k in ("ok", "model", "ir", "target", "batch", "seq", "executed", "note")} == {
        "ok": True, "model": str(path), "ir": "relax", "target": "llvm", "batch": 3, "seq": None,
        "executed": True, "note": ""}
    baseline, combined = doc["variants"]
    assert (baseline["label"], combined["label"]) == ("baseline", "combined")
    assert baseline["ops"]["matmul"] == 2 and combined["ops"]["matmul"] == 1
    assert doc["groups"] == ["2 x matmul -> add: input (3, 8), weights (8, 16), (8, 4), widths [16, 4]"]
    for v in (baseline, combined):
        assert 0 <= v["max_abs_diff"] <= 1e-5 and v["latency_s"] > 0 and v["compile_s"] > 0
    # timed in alternating rounds (2 runs: 2 rounds of 1): the speedup is the median of their ratios
    assert len(doc["speedup_rounds"]) == 2 and all(r > 0 for r in doc["speedup_rounds"])
    assert doc["speedup"] == pytest.approx(float(np.median(doc["speedup_rounds"])))
    assert "[tvm-combiners] timing baseline and combined: 2 alternating rounds of 1 run each" in err
    # onnxruntime timed beside TVM, with TVM's thread count
    assert doc["onnxruntime"]["latency_s"] > 0 and doc["onnxruntime"]["threads"] == cpu_threads()


def test_text_report_puts_onnxruntime_beside_tvm(capsys, tmp_path):
    """onnxruntime runs with TVM's thread count, whatever the machine's (TVM reads TVM_NUM_THREADS
    once, when an earlier test may already have started its pool)."""
    path = parallel_matmuls(tmp_path / "p.onnx")
    assert main(["run", str(path), "--batch", "3", "--repeat", "2"]) == 0
    out, err = capsys.readouterr()
    threads = f"{cpu_threads()} thread{'s' * (cpu_threads() != 1)}"
    assert f"[tvm-combiners] timing onnxruntime (2 runs, {threads})" in err
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert f"onnxruntime (cpu, {threads})" in rows
    assert float(rows[f"onnxruntime (cpu, {threads})"].split()[-2]) >= 0
    assert re.search(r"^latency over onnxruntime's: baseline \d+\.\d\dx, combined \d+\.\d\dx$", out, re.M)
    line = re.search(r"^speedup of combined over baseline: (\d+\.\d\dx \(median|no measurable difference \(median "
                     r"\d+\.\d\dx) of 2 alternating rounds, (\d+\.\d\d)x-(\d+\.\d\d)x\)$", out, re.M)
    assert line  # which of the two forms follows from the rounds: on both sides of 1, no difference
    assert line.group(1).startswith("no measurable") == (float(line.group(2)) <= 1.0 <= float(line.group(3)))


@pytest.mark.parametrize("groups, rounds, line", [
    ([], [1.05, 1.59], "none, nothing was combined (the modules are the same; their rounds' ratios, 1.05x-1.59x, "
                       "are the timing noise)"),
    (["2 x matmul"], [0.97, 1.02, 1.08], "no measurable difference (median 1.02x of 3 alternating rounds, "
                                         "0.97x-1.08x)"),
    (["2 x matmul"], [1.05, 1.10, 1.20], "1.10x (median of 3 alternating rounds, 1.05x-1.20x)"),
    (["2 x matmul"], [0.80, 0.86, 0.90], "0.86x (median of 3 alternating rounds, 0.80x-0.90x)"),
], ids=["nothing combined", "rounds on both sides of 1", "faster", "slower"])
def test_the_speedup_line_says_only_what_the_rounds_support(groups, rounds, line):
    """Two identical modules were reported as "speedup 1.54x [1.05-1.59]"; rounds of 0.36-1.43x as a speed-up."""
    from tvm_combiners.app.job import JobReport

    report = JobReport("m.onnx", "relax", "llvm", 1, 8, groups=groups, round_speedups=rounds)
    assert report.speedup_text(report.speedup()) == line
    assert report.to_dict()["speedup_measurable"] == line[0].isdigit()


def test_rounds_on_both_sides_of_1_are_doubled_to_tell():
    """The number of rounds follows the spread: a median off 1 whose interval holds 1 gets as many
    rounds again (once), which can narrow the interval to a verdict; a clear result gets none."""
    from tvm_combiners.app.job import JobReport, Variant, median_interval
    from tvm_combiners.app.job.timing import time_alternating

    assert median_interval([1.0, 5.0, 2.0, 3.0, 4.0]) == (1.0, 5.0)  # up to 5 rounds: all of them
    assert median_interval(range(10)) == (1, 8) and median_interval(range(20)) == (5, 14)

    def timed(ratios):  # baseline then combined, round after round: baseline/combined = each ratio
        said = []
        report = JobReport("m.onnx", "relax", "llvm", 1, 8, groups=["2 x matmul"])

        class Backend:
            times = iter([t for r in ratios for t in (r, 1.0)])

            def time(self, built, inputs, target, repeat):
                return next(self.times)

        runnable = [(Variant("baseline", {}, 0.0), None), (Variant("combined", {}, 0.0), None)]
        time_alternating(Backend(), runnable, {}, "llvm", 10, report, said.append)
        return report, said

    # 10 rounds, two below 1: the interval (2nd to 9th) 0.97x-1.20x holds 1; 10 more narrow it to 1.20x
    report, said = timed([0.95, 0.97] + [1.2] * 18)
    assert said[-1] == "the median's interval over the rounds is 0.97x-1.20x: 10 more rounds"
    assert len(report.round_speedups) == 20 and report.speedup_measurable()
    assert report.speedup_text(report.speedup()) == "1.20x (median of 20 alternating rounds, 1.20x-1.20x)"
    report, said = timed([1.2] * 10)  # clear at once
    assert len(report.round_speedups) == 10 and report.speedup_measurable() and not said[-1].startswith("the median")
    report, said = timed([0.9, 1.1] * 10)  # on both sides, median 1.0: more rounds would not tell
    assert len(report.round_speedups) == 10 and not report.speedup_measurable()


def test_json_error_document(capsys, tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    assert main(["run", str(path), "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ok": False, "error": {
        "file": str(path), "stage": "load", "message": "empty file (0 bytes), not an ONNX model",
        "bad_input": True, "exit_code": 2}}
    assert err.splitlines()[-1] == f"{ERROR}{path}: load: empty file (0 bytes), not an ONNX model"


def test_closed_stdout_is_not_a_traceback(tmp_path):
    """`tvm-combiners run --json | head -c 0`: the reader is gone before the report is written."""
    exe = shutil.which("tvm-combiners", path=os.path.dirname(sys.executable))
    proc = subprocess.Popen([exe, "run", str(parallel_matmuls(tmp_path / "p.onnx")), "--json", "--repeat", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "[tvm-combiners] timing baseline and combined: 1 alternating round of 1 run each" in err


def test_a_changed_result_is_never_reported_as_success(capsys, tmp_path, monkeypatch):
    """If a combined module ever computed something else, the job fails (exit 1) instead of printing a table."""
    from tvm_combiners.app.backends.relax import RelaxBackend

    real_run = RelaxBackend.run
    calls = []

    def miscompiled_run(self, built, inputs, target):  # baseline runs first, the combined module second
        outputs = real_run(self, built, inputs, target)
        calls.append(1)
        return outputs if len(calls) == 1 else [o * 2 for o in outputs]

    monkeypatch.setattr(RelaxBackend, "run", miscompiled_run)
    path = parallel_matmuls(tmp_path / "p.onnx")
    code, out, error = _run(capsys, path)
    assert code == 1 and out == ""
    assert error.startswith(f"{path}: check: the combined module's outputs differ from the baseline's by ")
    assert error.endswith("(a bug in tvm-combiners: rerun with --debug for the traceback)")


# a command line argparse rejects, an example's bad options ------------------------------------


@pytest.mark.parametrize("argv,line", [
    (["run", "x.onnx", "--batch", "x"], "run: argument --batch: invalid int value: 'x'"),
    (["run", "x.onnx", "--target", "rocm"], "run: argument --target: invalid choice: 'rocm' (choose from 'llvm', 'cuda')"),
    (["launch", "-n", "x"], "launch: argument -n/--np: invalid int value: 'x'"),
    ([], "the following arguments are required: {run,launch}"),
])
@pytest.mark.parametrize("as_json", [False, True])
def test_usage_error_is_one_line(capsys, argv, line, as_json):
    with pytest.raises(SystemExit) as exc:  # exit 2, as argparse's own
        main(argv + (["--json"] if as_json else []))
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert err == f"{ERROR}{line}\n"
    if as_json:
        assert json.loads(out) == {"ok": False, "error": {"file": None, "stage": "setup", "message": line,
                                                          "bad_input": True, "exit_code": 2}}
    else:
        assert out == ""


@pytest.mark.parametrize("argv,line", [
    # no abbreviations: '--hel' reached argparse's help action (help on stdout under --json)
    (["--example", "dp-train", "--json", "--", "--hel"], "launch --example dp-train: unrecognized arguments: --hel"),
    # the launcher's own options are checked before the job: its failure read as the job's, in two lines
    (["--timeout", "0", "--example", "dp-train", "--json"],
     "launch: the timeout must be a positive, finite number of seconds, got 0"),
])
def test_launch_options_are_checked_before_the_job(capsys, argv, line):
    assert main(["launch", "-n", "2", *argv]) == 2
    out, err = capsys.readouterr()
    assert err == f"{ERROR}{line}\n"
    assert json.loads(out) == {"ok": False, "error": {"file": None, "stage": "setup", "message": line,
                                                      "bad_input": True, "exit_code": 2}}


def test_abbreviated_options_are_refused(capsys):
    """'--js' was taken for --json, without the JSON error document."""
    with pytest.raises(SystemExit):
        main(["run", "x.onnx", "--js"])
    assert capsys.readouterr().err == f"{ERROR}unrecognized arguments: --js\n"


def test_usage_error_from_the_console_script():
    exe = shutil.which("tvm-combiners", path=os.path.dirname(sys.executable))
    proc = subprocess.run([exe, "run", "x.onnx", "--batch", "x", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"{ERROR}run: argument --batch: invalid int value: 'x'\n"
    assert json.loads(proc.stdout)["error"]["message"] == "run: argument --batch: invalid int value: 'x'"


@pytest.mark.parametrize("as_json", [False, True])
def test_launch_without_ranks_or_hosts_is_one_line(capsys, as_json):
    line = "launch: give the number of ranks (-n N), or hosts whose slots make it"
    assert main(["launch", "--example", "dp-train"] + (["--json"] if as_json else [])) == 2
    out, err = capsys.readouterr()
    assert err == f"{ERROR}{line}\n"
    if as_json:
        assert json.loads(out) == {"ok": False, "error": {"file": None, "stage": "setup", "message": line,
                                                          "bad_input": True, "exit_code": 2}}


def test_json_after_the_command_is_the_commands(capsys):
    # `launch` without -n: the --json after '--' belongs to the command, stdout stays empty
    assert main(["launch", "--", "python", "prog.py", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"{ERROR}launch: give the number of ranks (-n N), or hosts whose slots make it\n"


@pytest.mark.parametrize("example,ranks,options,rule", [
    ("dp-train", 2, ["--steps", "0"], "--steps must be a positive integer, got 0"),
    ("dp-train", 2, ["--heads", "0"], "--heads must be a positive integer, got 0"),
    ("dp-train", 2, ["--batch-per-rank", "0"], "--batch-per-rank must be a positive integer, got 0"),
    ("dp-train", 2, ["--seq", "0"], "--seq must be a positive integer, got 0"),
    ("dp-train", 2, ["--repeat", "0"], "--repeat must be a positive integer, got 0"),
    ("dp-train", 2, ["--threshold-bytes", "0"], "--threshold-bytes must be a positive integer, got 0"),
    ("dp-train", 2, ["--threshold-bytes", "-5"], "--threshold-bytes must be a positive integer, got -5"),
    ("dp-train", 2, ["--hidden", "100", "--heads", "3"], "--hidden 100 must be divisible by --heads 3"),
    ("dp-train", 2, ["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    ("dp-train", 2, ["--steps", "x"], "argument --steps: invalid int value: 'x'"),
    ("dp-train", 2, ["--bogus"], "unrecognized arguments: --bogus"),
    ("pipeline-bert", 4, [], "-n 4: one stage per rank needs 1 <= ranks <= 3 (the model's layers)"),
    ("pipeline-bert", 2, ["--seq", "0"], "--seq must be a positive integer, got 0"),
    ("pipeline-bert", 2, ["--seq", "600"], "--seq 600 is beyond the model's 512 positions"),
    ("pipeline-bert", 2, ["--micro-batch", "0"], "--micro-batch must be a positive integer, got 0"),
    ("pipeline-bert", 2, ["--micro-batches", "1"], "--micro-batches must be at least 2 (so stages overlap), got 1"),
    ("pipeline-bert", 3, ["--micro-batches", "4097"], "--micro-batches must be at most 1024, got 4097"),
    ("pipeline-bert", 2, ["--repeat", "0"], "--repeat must be a positive integer, got 0"),
    ("pipeline-bert", 2, ["--atol", "-1"], "--atol must be a finite number >= 0, got -1"),
])
def test_bad_example_options_are_refused_before_any_rank_starts(capsys, example, ranks, options, rule):
    # a short timeout: were the options let through, the job would start (and take minutes)
    argv = ["launch", "-n", str(ranks), "--timeout", "30", "--example", example, "--json", "--", *options]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    line = f"launch --example {example}: {rule}"
    assert err == f"{ERROR}{line}\n"  # no rank's progress line: none started
    assert json.loads(out) == {"ok": False, "error": {"file": None, "stage": "setup", "message": line,
                                                      "bad_input": True, "exit_code": 2}}


def test_missing_model_is_one_line_before_any_rank_starts(capsys, monkeypatch):
    from tvm_combiners.models import loader

    def missing():
        raise FileNotFoundError("the default model needs the PyPI package 'x': pip install x")

    monkeypatch.setattr(loader, "default_model_path", missing)
    assert main(["launch", "-n", "2", "--timeout", "30", "--example", "pipeline-bert"]) == 2
    assert capsys.readouterr().err == (f"{ERROR}launch --example pipeline-bert: the default model needs the PyPI "
                                       "package 'x': pip install x\n")


def test_zero_ranks_for_an_example(capsys):
    assert main(["launch", "-n", "0", "--example", "dp-train"]) == 2
    assert capsys.readouterr().err == f"{ERROR}launch: -n must be a positive number of ranks, got 0\n"


def test_example_help_is_printed_once_without_starting_ranks(capsys):
    assert main(["launch", "-n", "3", "--timeout", "30", "--example", "pipeline-bert", "--", "--help"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: tvm-combiners launch -n 3 --example pipeline-bert --") and out.count("usage:") == 1
    assert "--micro-batches MICRO_BATCHES" in out and err == ""


def test_python_dash_m_prints_one_line_for_an_example_option() -> None:
    """Review: under `python -m tvm_combiners.app.cli` the module ran as __main__, and the UsageError an
    example's option check raised (tvm_combiners.app.cli's class) escaped as a traceback, exit 1."""
    proc = subprocess.run([sys.executable, "-m", "tvm_combiners.app.cli", "launch", "-n", "1", "--example", "dp-train",
                           "--json", "--", "--bogus"], capture_output=True, text=True, timeout=120)
    line = "launch --example dp-train: unrecognized arguments: --bogus"
    assert (proc.returncode, proc.stderr) == (2, f"{ERROR}{line}\n")
    assert json.loads(proc.stdout)["error"]["message"] == line


def test_json_stays_alone_on_stdout_when_stderr_is_closed(tmp_path):
    """Review: with stderr closed (2>&-) sys.stderr is None, and print(file=None) wrote every progress
    line into stdout ahead of the JSON document."""
    path = parallel_matmuls(tmp_path / "m.onnx")
    proc = subprocess.run(f"{shlex.quote(sys.executable)} -m tvm_combiners.app.cli run {shlex.quote(str(path))} --json "
                          "--repeat 1 --ir relax 2>&-", shell=True, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["ok"] is True
