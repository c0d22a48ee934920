"""A tuned task's default schedule is measured and committed beside its search's records."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from helpers import make_module
from tvm import relax

from tvm_combiners.compile.relax_runner import make_target
from tvm_combiners.compile.tuning import database, intrinsics, measure, targets
from tvm_combiners.compile.tuning.defaults import commit_defaults, default_rules, default_schedule


def _gemm_and_softmax() -> tvm.IRModule:
    return make_module({"x": ((64, 128), "float32"), "w": ((128, 64), "float32")}, lambda bb, x, w: bb.emit(
        relax.op.nn.softmax(bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, w)))), axis=0)))


def _tasks(target_kind: str, mod: tvm.IRModule | None = None) -> tuple[tvm.target.Target, dict[str, object]]:
    """The MetaSchedule tasks of ``mod`` (a GEMM + relu and a softmax by default), by name."""
    target = targets.tuning_target(make_target(target_kind))
    tasks = measure.meta_schedule().relax_integration.extract_tasks(measure.fused(mod or _gemm_and_softmax(), target), target)
    return target, {t.task_name: t for t in tasks}


def _record(db, task, trace, seconds: float, target) -> None:
    ms = measure.meta_schedule()
    workload = task.dispatched[0]
    db.commit_tuning_record(ms.database.TuningRecord(
        trace, db.commit_workload(workload), [tvm.tirx.FloatImm("float32", seconds)], target, ms.arg_info.ArgInfo.from_prim_func(workload["main"])))


def _best(db, task):
    return db.get_top_k(db.commit_workload(task.dispatched[0]), 1)[0]


def test_cuda_rules_are_those_of_tvms_cuda_pipeline():
    """An untuned cuda build is TVM's pipeline: the candidate must be what that pipeline would schedule."""
    from tvm.relax.backend.cuda import pipeline

    target = make_target("cuda")
    theirs = next(p.rules for p in pipeline.legalize_passes(target) if hasattr(p, "rules"))
    assert [type(r) for r in default_rules(target)] == [type(r) for r in theirs]
    assert [type(r).__name__ for r in default_rules(make_target("llvm"))] == \
        ["CPUMatmul", "CPUGemv", "CPUConv2D", "CPUPool", "CPUReduction", "CPUInjective"]


def test_the_default_schedule_is_measured_and_committed_where_a_rule_applies():
    target, tasks = _tasks("llvm")
    gemm, softmax = tasks["fused_matmul_relu"], tasks["softmax"]
    db = measure.meta_schedule().database.MemoryDatabase()
    said: list[str] = []
    assert commit_defaults(db, [gemm, softmax], target, measure.runner(), measure.build_candidate, said.append) == 1
    assert said == []
    assert not db.has_workload(softmax.dispatched[0])  # the CPU rules decline a softmax over rows: it keeps its search's
    (record,) = db.get_all_tuning_records()
    assert 1e-7 < float(record.run_secs[0]) < 1e-2  # seconds: a 64 x 128 x 64 GEMM takes microseconds
    # the record's trace replays to what the default rule makes of the function
    replayed = tvm.s_tir.Schedule(gemm.dispatched[0])
    record.trace.apply_to_schedule(replayed, remove_postproc=False)
    assert tvm_ffi.structural_equal(replayed.mod, default_schedule(gemm.dispatched[0]["main"], target).mod)


@pytest.mark.parametrize("searched_s, default_best", [(1e-9, False), (10.0, True)])
def test_the_faster_of_search_and_default_is_the_best_record(searched_s, default_best):
    target, tasks = _tasks("llvm")
    gemm = tasks["fused_matmul_relu"]
    db = measure.meta_schedule().database.MemoryDatabase()
    searched = tvm.s_tir.Schedule(gemm.dispatched[0])  # a "searched" record (MetaSchedule skips empty traces)
    searched.unroll(searched.get_loops(searched.get_sblock("matmul"))[-1])
    _record(db, gemm, searched.trace, searched_s, target)
    assert commit_defaults(db, [gemm], target, measure.runner(), measure.build_candidate) == int(default_best)
    default = default_schedule(gemm.dispatched[0]["main"], target)
    assert (str(_best(db, gemm).trace) == str(default.trace)) is default_best
    assert len(db.get_all_tuning_records()) == 2


def _raises(*args, **kwargs):
    raise RuntimeError("codegen failed\nStack trace:\n  0: somewhere")


class _FailingRunner:
    """What MetaSchedule's LocalRunner gives back when the candidate raises on the device."""

    def run(self, inputs):
        class Future:
            def result(self):
                return measure.meta_schedule().runner.RunnerResult(None, "LocalRunner: An exception occurred\nTraceback (most "
                                                        "recent call last):\n  File x\nValueError: bad index")
        return [Future() for _ in inputs]


@pytest.mark.parametrize("broken, said", [
    ("build", "the default schedule of fused_matmul_relu did not build (codegen failed): not a candidate"),
    ("rule", "the default schedule of fused_matmul_relu did not build (codegen failed): not a candidate"),
    ("run", "the default schedule of fused_matmul_relu did not run (ValueError: bad index): not a candidate"),
])
def test_a_default_schedule_that_fails_is_no_candidate(monkeypatch, broken, said):
    """Said, and left out: the search's records stand (a dlight rule asserts instead of declining, too)."""
    from tvm_combiners.compile.tuning import defaults as default_candidates

    target, tasks = _tasks("llvm")
    if broken == "rule":
        monkeypatch.setattr(default_candidates, "default_schedule", _raises)
    runner = _FailingRunner() if broken == "run" else measure.runner()
    build = _raises if broken == "build" else measure.build_candidate
    db = measure.meta_schedule().database.MemoryDatabase()
    told: list[str] = []
    assert commit_defaults(db, [tasks["fused_matmul_relu"]], target, runner, build, told.append) == 0
    assert told == [said]
    assert len(db.get_all_tuning_records()) == 0


def test_dlights_schedule_survives_the_json_records_and_builds_for_cuda(tmp_path):
    """No GPU here to time it: its trace must still round-trip through the records TVM writes."""
    target, tasks = _tasks("cuda")
    gemm = tasks["fused_matmul_relu"]
    sch = default_schedule(gemm.dispatched[0]["main"], target)
    assert "__global__" in measure.build_candidate(sch.mod, target, None).imports[0].inspect_source()
    _record(measure.meta_schedule().database.JSONDatabase(work_dir=str(tmp_path)), gemm, sch.trace, 1e-5, target)
    reread = measure.meta_schedule().database.JSONDatabase(work_dir=str(tmp_path))
    replayed = tvm.s_tir.Schedule(gemm.dispatched[0])
    _best(reread, gemm).trace.apply_to_schedule(replayed, remove_postproc=False)
    assert tvm_ffi.structural_equal(replayed.mod, sch.mod)


def test_records_of_a_tensor_core_default_load_in_a_fresh_process(tmp_path):
    """Review: dlight schedules a float16 GEMM on cuda with tensor cores; the records' reader looks
    the intrinsics up, and a later run (which had not imported them) could not open its folder."""
    import subprocess
    import sys

    intrinsics.import_tensor_intrinsics()  # as tuning has before it asks for defaults (dlight's would take ~50 s)
    half = make_module({"x": ((128, 256), "float16"), "w": ((256, 256), "float16")},
                       lambda bb, x, w: bb.emit(relax.op.matmul(x, w)))
    target, tasks = _tasks("cuda", half)
    (task,) = tasks.values()
    sch = default_schedule(task.dispatched[0]["main"], target)
    assert "sch.tensorize(" in str(sch.trace)
    _record(database.open_database(tmp_path), task, sch.trace, 1e-5, target)
    code = ("import sys; from pathlib import Path; from tvm_combiners.compile.tuning import database, intrinsics, measure, search, targets; "
            "print(len(database.open_database(Path(sys.argv[1])).get_all_tuning_records()))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "1", proc.stderr[-2000:]
