"""The data-parallel training step: its module (one allreduce per gradient, a reference without any),
the checks of a run (Adam's amplified rounding allowed, wrong steps caught), and the whole example
on 4 ranks (SGD) and 2 ranks (Adam) through ``tvm-combiners launch --example dp-train --json``."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tvm_ffi")

from tvm_combiners.app.examples import dp_train as D  # noqa: E402

SCRIPT_DIR = os.path.dirname(sys.executable)
EXE = shutil.which("tvm-combiners", path=SCRIPT_DIR)


def test_step_has_one_allreduce_avg_per_gradient_and_the_reference_none():
    from tvm import relax

    from tvm_combiners.collectives import relax as C

    cfg = D.Config()
    mod, optimizer = D.build_module(cfg, batch=2, reference_batch=8)
    names = sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, relax.Function))
    assert names == ["main_adjoint", "main_full_adjoint", "optimizer", "step", "step_local", "sync"]
    shapes = D.param_shapes(cfg)
    assert len(shapes) == 15 * cfg.layers + 2  # no key bias
    found = {"step": [], "step_local": [], "sync": []}
    for name in found:
        relax.analysis.post_order_visit(mod[name], lambda e, name=name: found[name].append(C.info(e))
                                        if C.is_collective(e) else None)
    assert [s.kind for s in found["step"]] == ["allreduce"] * len(shapes)
    assert {s.op for s in found["step"]} == {"avg"}
    assert found["step_local"] == []
    assert found["sync"] == found["step"]  # the same allreduces, timed on their own
    assert not mod["step"].is_pure and mod["step_local"].is_pure
    sizes = D.count_allreduces(mod)
    assert sizes == [4 * int(__import__("numpy").prod(s)) for s in shapes.values()]
    assert optimizer.state is not None


def test_bucketing_respects_the_threshold():
    combiner = D.allreduce_combiner()
    assert combiner is not None, "AllReduceCombiner is exported by the collectives package"
    mod, _ = D.build_module(D.Config(), batch=2)
    total = sum(D.count_allreduces(mod))
    one = D.count_allreduces(combiner()(mod))
    assert one == [total]
    buckets = D.count_allreduces(combiner(threshold_bytes=300_000)(mod))
    assert 1 < len(buckets) < len(D.param_shapes(D.Config())) and sum(buckets) == total and max(buckets) <= 300_000


def test_dp_train_on_4_ranks_equals_one_process_on_the_full_batch():
    cmd = [EXE, "launch", "-n", "4", "--timeout", "240", "--example", "dp-train", "--json", "--",
           "--opt-level", "0", "--steps", "2", "--repeat", "2", "--threshold-bytes", "262144"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # exactly one document on stdout
    assert report["ok"] and report["failures"] == [], report["failures"]
    assert report["ranks"] == 4
    assert [p["rows"] for p in report["placement"]] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert sorted(sum((p["compiled"] for p in report["placement"]), [])) == sorted(report["variants"])
    variants = report["variants"]
    assert list(variants) == ["naive", "bucketed", "bucketed+parallel-ops"]
    naive, bucketed, parallel = variants["naive"], variants["bucketed"], variants["bucketed+parallel-ops"]
    assert naive["allreduces"] == 32
    assert 1 < bucketed["allreduces"] < 32 and bucketed["allreduces"] == parallel["allreduces"]
    assert bucketed["allreduce_bytes_total"] == naive["allreduce_bytes_total"] == report["parameters"]["bytes"]
    assert max(bucketed["bucket_bytes"]) <= 262144
    assert any(n.startswith("parallel ops: 3 x matmul") for n in parallel["notes"])
    for v in variants.values():
        assert v["max_rel_diff_grads_vs_reference"] <= 1e-5
        assert v["max_rel_diff_params_vs_reference"] <= 1e-5
        assert v["max_rel_diff_loss_vs_reference"] <= 1e-5
        assert v["max_abs_diff_across_ranks"] == 0.0
        assert v["max_rel_diff_vs_naive"] <= 1e-5
        assert len(v["loss"]) == 2 and v["step_s"] > 0
        for got, want in zip(v["loss"], report["reference_loss"]):
            assert abs(got - want) <= 1e-5 * abs(want)
    assert "[dp-train]" in proc.stderr  # progress lines go to stderr


def test_adam_from_tvm_builds_its_state_and_update():
    # TVM 0.27's Adam.init raises on its own dtype (np.ones((), DataType)); the example's subclass fixes it
    from tvm.relax.training import optimizer as opt

    cfg = D.Config(optimizer="adam", lr=1e-3)
    adam = D.make_optimizer(cfg)
    assert isinstance(adam, opt.Adam)
    n = len(D.param_shapes(cfg))
    assert len(adam.state) == 3 + 2 * n  # steps, beta1^t, beta2^t, first and second moments
    assert adam.dtype == "float32"
    func = adam.get_function()
    assert len(func.params) == 3 and len(func.params[0].ty.fields) == n


def test_adam_on_2_ranks_passes():
    # Adam's g / (|g| + eps) turns float32 rounding of near-zero gradients into parameter differences
    # far above 1e-5 relative: a correct run once reported FAILED. After 8 steps the two runs'
    # gradients differ too (2.3e-5: they are taken at parameters that moved apart); each program's
    # are checked against the full batch's at its own parameters
    # two threads a rank (launch keeps TVM_NUM_THREADS): a schedule that races between threads
    # computes right with one (the backward's where(x < 0, 0, dy @ w) did: NaN gradients with two)
    cmd = [EXE, "launch", "-n", "2", "--timeout", "240", "--example", "dp-train", "--json", "--",
           "--opt-level", "0", "--steps", "8", "--repeat", "1", "--optimizer", "adam"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TVM_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["failures"] == [] and report["config"]["optimizer"] == "adam"
    for v in report["variants"].values():
        assert v["max_rel_diff_grads_vs_reference"] <= 1e-5
        assert v["max_rel_diff_params_vs_optimizer"] <= 1e-5
        assert v["max_rel_diff_params_vs_reference"] <= v["params_vs_reference_allowed"]


def _stepped(optimizer, p0, grads, loss):
    """A rank's results as run_steps records them: parameters after each step, in float32 as TVM's."""
    params = [p.astype("float32") for p in D.replay_optimizer(optimizer, p0, grads)]
    return {"grads": grads, "params": params, "loss": loss, "grads_at_run": grads, "loss_at_run": loss}


def _failed(failures):
    return [f.split(": relative difference")[0] for f in failures]


def test_check_allows_adams_amplified_rounding_and_catches_wrong_steps():
    adam = D.new_optimizer(D.Config(optimizer="adam", lr=0.02))
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(1000).astype("float32")
    ref_grads = [rng.standard_normal(1000).astype("float32") for _ in range(2)]
    for g in ref_grads:
        g[7] = 1e-9  # zero in exact arithmetic: only rounding noise, which the ranks' sum rounds otherwise
    dp_grads = [g.copy() for g in ref_grads]
    for g in dp_grads:
        g[7] += np.float32(1.6e-9)
    ref = _stepped(adam, p0, ref_grads, [1.0, 0.9])
    dp = _stepped(adam, p0, dp_grads, [1.0, 0.9])
    assert D.rel_diff(dp["params"][1], ref["params"][1]) > 1e-4  # what once failed a right run
    checked, failures = D.check_variant("bucketed", [dp, dp], ref, dp, adam, p0)
    assert failures == []
    assert checked["max_rel_diff_params_vs_optimizer"] <= 1e-6
    assert checked["max_rel_diff_params_vs_reference"] <= checked["params_vs_reference_allowed"]

    moved = {**dp, "params": [dp["params"][0], dp["params"][1].copy()]}
    moved["params"][1][3] += 0.002  # a tenth of lr: inside the rounding allowance vs the full batch
    _, failures = D.check_variant("bucketed", [moved, moved], ref, dp, adam, p0)
    assert _failed(failures) == ["bucketed: parameters vs the optimizer on the averaged gradients",
                                 "bucketed: differs from the naive program"]

    summed = _stepped(adam, p0, [2 * g for g in dp_grads], [1.0, 0.9])  # allreduce(sum) where avg belongs
    _, failures = D.check_variant("bucketed", [summed, summed], ref, dp, adam, p0)
    assert _failed(failures) == ["bucketed: gradients vs the full-batch step", "bucketed: differs from the naive program"]

    _, failures = D.check_variant("bucketed", [dp, moved], ref, dp, adam, p0)
    assert failures[-1] == "bucketed: ranks disagree on gradients or parameters (max |diff| 0.002)"


def test_check_holds_sgd_to_the_full_batch_step():
    sgd = D.new_optimizer(D.Config(optimizer="sgd", lr=0.02))
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(1000).astype("float32")
    grads = [rng.standard_normal(1000).astype("float32") for _ in range(2)]
    ref = _stepped(sgd, p0, grads, [1.0, 0.9])
    checked, failures = D.check_variant("naive", [ref], ref, ref, sgd, p0)
    assert failures == [] and checked["params_vs_reference_allowed"] == pytest.approx(1e-5)
    moved = {**ref, "params": [ref["params"][0], ref["params"][1] + np.float32(1e-3)]}
    _, failures = D.check_variant("naive", [moved], ref, ref, sgd, p0)
    assert _failed(failures) == ["naive: parameters vs the optimizer on the averaged gradients",
                                 "naive: parameters vs the full-batch step", "naive: differs from the naive program"]


def test_failed_compile_leaves_no_folder(tmp_path):
    """compile_shared on 2 ranks, rank 1's build raising: one error, and its shared folder removed."""
    prog = tmp_path / "prog.py"
    prog.write_text(
        "from tvm_combiners.app.examples.report import compile_shared\n"
        "class Built:\n"
        "    def export_library(self, path):\n"
        "        open(path, 'w').write('not a library')\n"
        "def fail():\n"
        "    raise RuntimeError('no compiler here')\n"
        "compile_shared({'a': Built, 'b': fail}, 'test')\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([EXE, "launch", "-n", "2", "--timeout", "60", "--", "python", str(prog)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode != 0
    assert "tvm-combiners launch: rank 1 failed: RuntimeError: no compiler here" in proc.stderr, proc.stderr
    assert list(tmp.iterdir()) == []


def test_oversubscription_is_named_only_where_ranks_outnumber_cores(monkeypatch):
    from tvm_combiners.app.examples import report

    monkeypatch.setattr(report, "usable_cores", lambda: 2)
    assert report.oversubscription(2) is None
    assert report.oversubscription(3) == "3 ranks on 2 cores: timings include oversubscription"


def test_a_loss_of_exactly_zero_is_checked_not_divided_by():
    """Review finding (2026-11-25): a full-batch loss of 0.0 (every row classified with certainty)
    ended dp-train with ZeroDivisionError instead of a report."""
    sgd = D.new_optimizer(D.Config(optimizer="sgd", lr=0.02))
    p0 = np.ones(10, "float32")
    grads = [np.zeros(10, "float32")] * 2
    ref = _stepped(sgd, p0, grads, [0.0, 0.0])
    checked, failures = D.check_variant("naive", [ref], ref, ref, sgd, p0)
    assert failures == [] and checked["max_rel_diff_loss_vs_reference"] == 0.0
    off = {**ref, "loss": [0.0, 1e-3]}
    _, failures = D.check_variant("naive", [off], ref, ref, sgd, p0)
    assert _failed(failures) == ["naive: loss vs the full-batch step"]


def test_a_nan_after_the_first_step_fails_the_check():
    """Python's max drops a NaN that follows a number (max([1e-7, nan]) == 1e-7): a program whose
    gradients, parameters and loss went NaN from step 2 on passed every check (review finding);
    pipeline_bert's check over micro-batches takes its worst difference the same way."""
    from tvm_combiners.app.compare import largest as worst

    assert np.isnan(worst([1e-7, float("nan"), 0.0])) and worst(x for x in (1.0, 3.0)) == 3.0
    cfg = D.Config(layers=1, hidden=16, heads=2, ffn=32, seq=4, steps=3)
    opt = D.make_optimizer(cfg)
    p0 = np.concatenate([a.ravel() for a in D.init_params(cfg).values()])
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(p0.size).astype("float32") for _ in range(cfg.steps)]
    params = [p.astype("float32") for p in D.replay_optimizer(opt, p0, grads)]
    reference = {"grads": grads, "params": params, "loss": [1.0, 0.9, 0.8], "grads_at_run": grads,
                 "loss_at_run": [1.0, 0.9, 0.8]}
    good = {"grads": grads, "params": params, "loss": [1.0, 0.9, 0.8]}
    assert D.check_variant("bucketed", [good, good], reference, reference, opt, p0)[1] == []
    nan = np.full(p0.size, np.nan, "float32")
    bad = {"grads": [grads[0], nan, nan], "params": [params[0], nan, nan], "loss": [1.0, float("nan"), float("nan")]}
    checked, failures = D.check_variant("bucketed", [good, bad], reference, reference, opt, p0)
    assert len(failures) == 6, failures
    assert all(np.isnan(v) for k, v in checked.items() if k.startswith("max_")), checked


@pytest.mark.parametrize("example", ["dp_train", "pipeline_bert"])
def test_a_json_out_that_cannot_be_written_is_refused_before_the_job(tmp_path, example):
    """The job ran to its end, then rank 0 failed on open() with a traceback (exit 1, the report lost)."""
    for path, why in ((tmp_path / "no" / "r.json", f"no folder {tmp_path / 'no'}"), (tmp_path, "is a folder"),
                      (f"{tmp_path / 'new'}/", "is a folder")):  # a folder yet to be made (helper-52)
        proc = subprocess.run([sys.executable, "-m", f"tvm_combiners.app.examples.{example}", "--json-out", str(path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == f"python -m tvm_combiners.app.examples.{example}: error: --json-out {path}: {why}\n"
