"""A tuned task's default schedule is measured and committed beside its search's records."""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_combiners.relax import tuning
from tvm_combiners.relax.default_candidates import commit_defaults, default_rules, default_schedule
from tvm_combiners.relax.runner import make_target


@I.ir_module
class GemmAndSoftmax:
    @R.function
    def main(x: R.Tensor((64, 128), "float32"), w: R.Tensor((128, 64), "float32")) -> R.Tensor((64, 64), "float32"):
        with R.dataflow():
            y = R.nn.relu(R.matmul(x, w))
            z = R.nn.softmax(y, axis=-1)
            R.output(z)
        return z


def _tasks(target_kind: str) -> tuple[tvm.target.Target, dict[str, object]]:
    target = tuning.tuning_target(make_target(target_kind))
    tasks = tuning._ms().relax_integration.extract_tasks(tuning._fused(GemmAndSoftmax, target), target)
    return target, {t.task_name: t for t in tasks}


def _record(db, task, trace, seconds: float, target) -> None:
    ms = tuning._ms()
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
    assert [type(r).__name__ for r in default_rules(make_target("llvm"))] == ["CPUMatmul"]


def test_the_default_schedule_is_measured_and_committed_where_a_rule_applies():
    target, tasks = _tasks("llvm")
    gemm, softmax = tasks["fused_matmul_relu"], tasks["softmax"]
    db = tuning._ms().database.MemoryDatabase()
    said: list[str] = []
    assert commit_defaults(db, [gemm, softmax], target, tuning._runner(), tuning.build_candidate, said.append) == 1
    assert said == []
    assert not db.has_workload(softmax.dispatched[0])  # the CPU rule declines a softmax: it keeps its search's
    (record,) = db.get_all_tuning_records()
    assert 0 < float(record.run_secs[0]) < 1
    # the record's trace replays to what the default rule makes of the function
    replayed = tvm.s_tir.Schedule(gemm.dispatched[0])
    record.trace.apply_to_schedule(replayed, remove_postproc=False)
    assert tvm_ffi.structural_equal(replayed.mod, default_schedule(gemm.dispatched[0]["main"], target).mod)


@pytest.mark.parametrize("searched_s, default_best", [(1e-9, False), (10.0, True)])
def test_the_faster_of_search_and_default_is_the_best_record(searched_s, default_best):
    target, tasks = _tasks("llvm")
    gemm = tasks["fused_matmul_relu"]
    db = tuning._ms().database.MemoryDatabase()
    searched = tvm.s_tir.Schedule(gemm.dispatched[0])  # a "searched" record (MetaSchedule skips empty traces)
    searched.unroll(searched.get_loops(searched.get_sblock("matmul"))[-1])
    _record(db, gemm, searched.trace, searched_s, target)
    assert commit_defaults(db, [gemm], target, tuning._runner(), tuning.build_candidate) == int(default_best)
    default = default_schedule(gemm.dispatched[0]["main"], target)
    assert (str(_best(db, gemm).trace) == str(default.trace)) is default_best
    assert len(db.get_all_tuning_records()) == 2


def test_a_default_schedule_that_does_not_build_is_no_candidate():
    target, tasks = _tasks("llvm")

    def broken(mod, target, params):
        raise RuntimeError("codegen failed\nStack trace:\n  0: somewhere")

    db = tuning._ms().database.MemoryDatabase()
    said: list[str] = []
    assert commit_defaults(db, [tasks["fused_matmul_relu"]], target, tuning._runner(), broken, said.append) == 0
    assert said == ["the default schedule of fused_matmul_relu did not build (codegen failed): not a candidate"]
    assert len(db.get_all_tuning_records()) == 0


def test_dlights_schedule_survives_the_json_records_and_builds_for_cuda(tmp_path):
    """No GPU here to time it: its trace must still round-trip through the records TVM writes."""
    target, tasks = _tasks("cuda")
    gemm = tasks["fused_matmul_relu"]
    sch = default_schedule(gemm.dispatched[0]["main"], target)
    assert "__global__" in tuning.build_candidate(sch.mod, target, None).imports[0].inspect_source()
    _record(tuning._ms().database.JSONDatabase(work_dir=str(tmp_path)), gemm, sch.trace, 1e-5, target)
    reread = tuning._ms().database.JSONDatabase(work_dir=str(tmp_path))
    replayed = tvm.s_tir.Schedule(gemm.dispatched[0])
    _best(reread, gemm).trace.apply_to_schedule(replayed, remove_postproc=False)
    assert tvm_ffi.structural_equal(replayed.mod, sch.mod)
