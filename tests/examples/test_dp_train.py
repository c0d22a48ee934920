"""The data-parallel training step: its module (one allreduce per gradient, a reference without any)
and the whole example on 4 ranks through ``tvm-combiners launch --example dp-train --json``."""

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("tvm_ffi")

from tvm_combiners.examples import dp_train as D  # noqa: E402

SCRIPT_DIR = os.path.dirname(sys.executable)


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
    exe = shutil.which("tvm-combiners", path=SCRIPT_DIR)
    cmd = [exe, "launch", "-n", "4", "--timeout", "240", "--example", "dp-train", "--json", "--",
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
