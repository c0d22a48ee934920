"""The main job's result checks: what counts as equal outputs, and what fails the combined module.

A review found changed results passing: a NaN in any output after the first (Python's ``max``
drops it), every check off once an output held an infinity (inf - inf is NaN, the tolerance inf),
and small outputs checked against a tolerance of at least 1e-4 (or the largest output's scale).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tvm_combiners.app.job import JobError, max_abs_diff, output_diff, output_diffs
from tvm_combiners.app.job.checks import check_combined

F = np.float32


def test_equal_nans_and_infinities_agree_and_nothing_else_does() -> None:
    a = np.array([1.0, np.nan, np.inf, -np.inf], F)
    assert output_diff(a, a.copy()) == 0.0
    assert output_diff(np.array([1.5, 2.0], F), np.array([1.0, 2.0], F)) == 0.5
    for other in ([1.0, 0.0, np.inf, -np.inf], [1.0, np.nan, -np.inf, -np.inf], [1.0, np.nan, np.inf, 7.0]):
        assert math.isnan(output_diff(a, np.array(other, F))), other
    assert math.isnan(output_diff(np.zeros((3, 4)), np.zeros((1, 4))))  # would broadcast to 0
    assert output_diff(np.zeros((3, 0)), np.zeros((3, 0))) == 0.0  # numpy's max of nothing raised
    assert output_diff(np.array([3, 5], np.int64), np.array([3, 9], np.int64)) == 4.0
    assert output_diff(np.array([True, False]), np.array([True, True])) == 1.0


def test_a_nan_in_any_output_is_the_largest_difference() -> None:
    ok = [np.ones(3, F), np.ones(2, F)]
    for bad in range(2):
        outs = [o.copy() for o in ok]
        outs[bad][0] = np.nan
        assert math.isnan(max_abs_diff(outs, ok)), bad
    assert max_abs_diff(ok, ok) == 0.0 and max_abs_diff([], []) == 0.0


def _check(combined: list[np.ndarray], baseline: list[np.ndarray], reference: list[np.ndarray] | None = None) -> None:
    check_combined("m.onnx", combined, baseline, None if reference is None else output_diffs(baseline, reference))


def _fails(combined: list[np.ndarray], baseline: list[np.ndarray], reference: list[np.ndarray] | None = None) -> str:
    with pytest.raises(JobError) as info:
        _check(combined, baseline, reference)
    assert info.value.stage == "check" and info.value.exit_code == 1
    return info.value.problem


def test_every_output_is_checked_against_its_own_scale() -> None:
    small = np.full(4, 1e-5, F)
    assert _fails([np.zeros(4, F)], [small]).startswith(
        "the combined module's outputs differ from the baseline's by 1.000e-05 (output 0, allowed 1.0e-07)")
    big = np.full(2, 1e6, F)
    assert "(output 0, allowed 1.0e-04)" in _fails([np.ones(2, F) * 2, big], [np.ones(2, F), big])
    _check([small * (1 + 1e-6), big], [small, big])  # float32 rounding passes
    _check([np.full(3, 5e-8, F)], [np.zeros(3, F)])  # an all-zero output: the floor


def test_outputs_computed_by_cancellation_may_carry_the_noise_the_baseline_shows() -> None:
    """y1 - y2 of two large, nearly equal sums: two correct float32 evaluations differ by ~1e-3 of its
    scale (a review's model: 4.8e-6 on a 6e-3 output); the baseline's distance from onnxruntime says so."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((256, 8))
    w2 = w1 + 1e-4 * rng.standard_normal((256, 8))
    x = rng.standard_normal((4, 256)) * 30
    exact = x @ w1 - x @ w2
    one_order = (x.astype(F) @ w1.astype(F) - x.astype(F) @ w2.astype(F)).astype(F)
    other_order = (x.astype(F) @ (w1 - w2).astype(F)).astype(F)  # what a different schedule might compute
    onnxruntime = exact.astype(F)
    _check([other_order], [one_order], [onnxruntime])
    wrong = other_order * 2
    assert "(output 0, allowed" in _fails([wrong], [one_order], [onnxruntime])


def test_nans_infinities_and_shapes_are_checked() -> None:
    inf = np.array([np.inf, 1.0], F)
    _check([inf.copy(), np.ones(2, F)], [inf, np.ones(2, F)])
    assert "(output 0, allowed" in _fails([np.array([np.inf, 2.0], F)], [inf])  # was: check off
    assert _fails([np.ones(2, F), np.array([np.nan, 1.0], F)], [np.ones(2, F), np.ones(2, F)]) == (
        "output 1 of the combined module has NaN or infinity where the baseline's has another value")
    assert _fails([np.zeros((3, 4), F)], [np.zeros((1, 4), F)]) == (
        "output 0 of the combined module has shape (3, 4), the baseline's (1, 4)")


def test_the_header_shows_the_sizes_the_modules_ran_on() -> None:
    from tvm_combiners.app.job import JobReport

    dynamic = JobReport("m.onnx", "relax", "llvm", 3, 5, inputs={"ids": [3, 5], "mask": [3, 5], "scale": [1]})
    assert dynamic.sizes() == "batch 3  seq 5"
    static = JobReport("m.onnx", "relax", "llvm", 3, 5, inputs={"x": [1, 8]})  # the header said batch 3, seq 5
    assert static.sizes() == "inputs x (1, 8) (--batch 3 and --seq 5 do not apply: no input axis of the model takes them)"
    no_seq = JobReport("m.onnx", "relax", "llvm", 3, 5, inputs={"x": [3, 16]})
    assert no_seq.sizes() == "inputs x (3, 16) (--seq 5 does not apply: no input axis of the model takes it)"
    assert static.to_dict()["inputs"] == {"x": [1, 8]}
    image = JobReport("m.onnx", "relax", "llvm", 1, 10, inputs={"img": [1, 3, 10, 10]})  # --seq set h and w
    assert image.sizes() == "batch 1  seq 10"  # said "--seq 10 does not apply" (review)
    swapped = JobReport("m.onnx", "relax", "llvm", 2, 8, inputs={"b_t": [8, 2, 16]})  # named dims
    assert swapped.sizes() == "batch 2  seq 8"
    # --json reports the sizes that sized something, null for the others
    sized = {name: [r.to_dict()[k] for k in ("batch", "seq")] for name, r in
             [("dynamic", dynamic), ("static", static), ("no_seq", no_seq), ("image", image)]}
    assert sized == {"dynamic": [3, 5], "static": [None, None], "no_seq": [3, None], "image": [1, 10]}
    given = JobReport("m.onnx", "relax", "llvm", 1, 128, inputs={"ids": [1, 128]}, shapes_given=True, all_given=True)
    assert (given.to_dict()["batch"], given.to_dict()["seq"]) == (None, None)  # the user's shapes, not the sizes


def test_onnxruntime_is_timed_on_the_cores_the_process_started_with(monkeypatch) -> None:
    """TVM's thread pool pins the thread that starts it to one core; onnxruntime's threads inherited it."""
    import os

    import tvm

    from tvm_combiners.compile.host import START_CORES
    from tvm_combiners.models import loader

    if not hasattr(os, "sched_getaffinity") or len(START_CORES) < 2:
        pytest.skip("needs a process allowed on 2 or more cores")
    tvm.get_global_func("runtime.NumThreads")()  # starts TVM's pool (unpinned under the tests' conftest)
    seen = []

    class Binding:
        def bind_cpu_input(self, _name, _value):
            pass

    class Session:
        def io_binding(self):
            return Binding()

        def get_outputs(self):
            return []

        def run_with_iobinding(self, _binding):
            seen.append(os.sched_getaffinity(0))

    monkeypatch.setattr(loader, "_ort_session", lambda model, threads: Session())
    os.sched_setaffinity(0, {min(START_CORES)})  # what TVM's pool does to the thread that starts it
    try:
        loader.time_onnxruntime(None, {}, repeat=2, threads=2)
        assert os.sched_getaffinity(0) == {min(START_CORES)}  # the pin is left as it was
    finally:
        os.sched_setaffinity(0, START_CORES)
    assert seen and all(cpus == set(START_CORES) for cpus in seen)


def test_a_baseline_far_from_onnxruntime_widens_the_check_only_so_far() -> None:
    """Review: TVM's Relay softmax (opset 11) is 0.85 off onnxruntime; 10x that let random numbers
    pass as the combined output. The noise allowance stops at NOISE_CAP of the output's scale, and
    the report says the baseline computes something else."""
    from tvm_combiners.app.job.checks import NOISE_CAP, reference_disagreement

    rng = np.random.default_rng(0)
    reference = rng.random((8, 16)).astype(F)
    reference /= reference.sum(-1, keepdims=True)
    baseline = np.roll(reference, 1, axis=0)  # a frontend computing something else
    assert "allowed" in _fails([rng.random((8, 16)).astype(F)], [baseline], [reference])
    scale = float(np.abs(baseline).max())
    _check([baseline + 0.9 * NOISE_CAP * scale], [baseline], [reference])
    assert "allowed" in _fails([baseline + 1.1 * NOISE_CAP * scale], [baseline], [reference])
    note = reference_disagreement(output_diffs([np.zeros(2, F), baseline], [np.zeros(2, F), reference]),
                                  [np.zeros(2, F), reference])
    assert note is not None and note.startswith("warning: TVM's baseline differs from onnxruntime by ")
    assert "on output 1 (scale" in note
    assert reference_disagreement(output_diffs([reference * (1 + 1e-6)], [reference]), [reference]) is None


def test_integer_outputs_must_match_exactly() -> None:
    """Review: ids [29990, 7] passed for [29990, 5] (1e-4 of the output's scale is 3), and int64 values
    past 2**53 that differ by 1 were equal once converted to float64."""
    ids = np.array([29990, 5], np.int64)
    assert _fails([np.array([29990, 7], np.int64)], [ids]) == (
        "the combined module's outputs differ from the baseline's by 2.000e+00 (output 0, allowed 0.0e+00)")
    big = np.array([2**60], np.int64)
    assert output_diff(big + 1, big) == 1.0
    assert "allowed 0.0e+00" in _fails([big + 1], [big])
    assert "allowed 0.0e+00" in _fails([np.array([True, False])], [np.array([True, True])])
    _check([ids.copy(), np.array([True])], [ids, np.array([True])])
