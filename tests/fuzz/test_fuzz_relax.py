"""Differential fuzzing of the Relax passes: random parallel-branch modules, every pass family.

Each module is checked for equal outputs against the unoptimized module on llvm, well-formedness,
idempotence (the pass twice equals the pass once) and determinism (two builds, two runs: equal).
Unset, ``FUZZ_EXAMPLES`` keeps a small derandomized slice for ``make test``; ``make fuzz`` sets it.
"""

from __future__ import annotations

import fuzz_stats
import numpy as np
import pytest
import tvm
import tvm_ffi
from build_relax import ROOT_OPS, build_module, random_inputs
from fuzz_spec import (
    FAMILIES,
    ModuleSpec,
    Options,
    example_count,
    explicit_cases,
    is_big_run,
    module_specs,
    options,
)
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from tvm import relax
from tvm.relax.utils import copy_with_new_vars

from tvm_combiners.compile.relax_runner import count_ops
from tvm_combiners.relax import (
    CombineParallelBatchMatmul,
    CombineParallelConv2D,
    CombineParallelMatmul,
    CombineParallelOps,
)

PASSES = {
    "matmul": CombineParallelMatmul,
    "batch_matmul": CombineParallelBatchMatmul,
    "conv2d": CombineParallelConv2D,
    "ops": CombineParallelOps,
}
#: Which families a pass's graphs draw their roots from: mostly its own, some of the others.
MIX = {
    "matmul": ("matmul",) * 4 + ("batch_matmul", "conv2d"),
    "batch_matmul": ("batch_matmul",) * 4 + ("matmul", "conv2d"),
    "conv2d": ("conv2d",) * 4 + ("matmul",),
    "ops": FAMILIES,
}
DTYPES = ("float32", "float32", "float16", "int32", "int8")
#: The small slice ``make test`` runs per pass (derandomized); ``FUZZ_EXAMPLES`` scales it.
CI_EXAMPLES = 10

SETTINGS = settings(
    max_examples=example_count(CI_EXAMPLES),
    deadline=None,
    derandomize=not is_big_run(),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)


def tolerance(spec: ModuleSpec) -> float:
    """Relative tolerance: float16 anywhere (as a dtype or through a cast) loosens it."""
    loose = any(g.dtype == "float16" or any(f.op == "cast" for b in g.branches for f in b.followers)
                for g in spec.graphs)
    return 2e-2 if loose else 1e-4


#: Unoptimized LLVM: these tiny graphs compile twice as fast, and both sides use the same code generator.
TARGET = tvm.target.Target({"kind": "llvm", "opt-level": 0})


@relax.expr_functor.mutator
class _RenameCalls(relax.PyExprMutator):
    def __init__(self, mapping: dict) -> None:
        super().__init__()
        self.mapping = mapping

    def visit_global_var_(self, op: relax.GlobalVar) -> relax.Expr:
        return self.mapping.get(op.name_hint, op)


def side_by_side(before: tvm.IRModule, after: tvm.IRModule) -> tvm.IRModule:
    """``after`` plus ``before``'s functions renamed ``ref_*``: one compile and one JIT for both."""
    bb = relax.BlockBuilder(after)
    renamed: dict[str, relax.GlobalVar] = {}
    # callees first (only main calls other functions), so main's calls see typed GlobalVars
    for gv, func in sorted(before.functions_items(), key=lambda item: item[0].name_hint == "main"):
        func = _RenameCalls(renamed).visit_expr(func) if gv.name_hint == "main" else func
        func = copy_with_new_vars(func)  # a Var may be defined in one function only
        if func.attrs and "global_symbol" in func.attrs:
            func = func.with_attr("global_symbol", "ref_" + gv.name_hint)
        renamed[gv.name_hint] = bb.add_func(func, "ref_" + gv.name_hint)
    return bb.get()


def _flat(value: object) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [array for item in value for array in _flat(item)]


def assert_outputs_equal(before: tvm.IRModule, after: tvm.IRModule, spec: ModuleSpec) -> None:
    inputs = random_inputs(before, spec.seed)
    both = tvm.compile(side_by_side(before, after), target=TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))
    vm = relax.VirtualMachine(both, tvm.cpu())  # setting up a VM JIT-compiles the module: once
    args = [tvm.runtime.tensor(a) for a in inputs]
    expected, got = _flat(vm["ref_main"](*args)), _flat(vm["main"](*args))
    assert len(expected) == len(got)
    tol = tolerance(spec)
    for i, (e, g) in enumerate(zip(expected, got)):
        assert e.shape == g.shape and e.dtype == g.dtype, f"output {i}: {g.shape} {g.dtype} vs {e.shape} {e.dtype}"
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e, err_msg=f"output {i}")
        else:
            finite = np.abs(e[np.isfinite(e)])
            scale = max(1.0, float(finite.max()) if finite.size else 1.0)
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol * scale, err_msg=f"output {i}")


def check_pass(family: str, spec: ModuleSpec, opts: Options) -> None:
    """Every property one fuzzed module must keep under one pass."""
    make = PASSES[family]
    mod = build_module(spec)
    new = mod
    try:
        new = make(**opts.kwargs())(mod)
        changed = _check(make, family, spec, opts, mod, new)
    except Exception as err:
        fuzz_stats.record("relax", make.__name__, spec.count(), False, failed=f"{type(err).__name__}: {err}"[:300])
        if currently_in_test_context():  # the failing example's modules, printed with hypothesis's report
            note(f"before:\n{mod.script()}\nafter:\n{new.script()}")
        raise
    fuzz_stats.record("relax", make.__name__, spec.count(), changed)


def _check(make, family: str, spec: ModuleSpec, opts: Options, mod: tvm.IRModule, new: tvm.IRModule) -> bool:
    assert relax.analysis.check_well_formed(new), "not well formed after the pass"
    before, after = count_ops(mod), count_ops(new)
    for op in set(ROOT_OPS.values()):
        assert after[op] <= before[op], f"{op}: {before[op]} -> {after[op]}"
    if family == "conv2d":
        assert after["matmul"] == before["matmul"], "the conv2d pass changed matmuls"
    elif family in ("matmul", "batch_matmul"):
        assert after["nn.conv2d"] == before["nn.conv2d"], f"the {family} pass changed convolutions"
    again = make(**opts.kwargs())(build_module(spec))
    assert tvm_ffi.structural_equal(again, new), "not deterministic: two runs on equal modules differ"
    twice = make(**opts.kwargs())(new)
    assert tvm_ffi.structural_equal(twice, new), "not idempotent: a second run changed the module"
    changed = not tvm_ffi.structural_equal(new, mod)
    if changed:
        assert_outputs_equal(mod, new, spec)
    return changed


@st.composite
def cases(draw, family: str) -> tuple[ModuleSpec, Options]:
    spec = draw(module_specs("relax", MIX[family], DTYPES))
    return spec, draw(options(family))


@pytest.mark.parametrize("family", list(PASSES))
def test_fuzz_relax(family: str) -> None:
    @SETTINGS
    @given(cases(family))
    def run(case: tuple[ModuleSpec, Options]) -> None:
        check_pass(family, *case)

    for case in explicit_cases(family):
        run = example(case)(run)
    run()
