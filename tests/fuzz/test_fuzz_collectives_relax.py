"""Differential fuzzing of the Relax collective combiners: random channel-heavy programs, every pass.

Each program (``collective_spec``; some in dataflow blocks, with TVM's own ``R.ccl`` ops) runs on
one rank through the collectives runtime, before and after each pass setting: outputs must be
bitwise equal, and equal to numpy's reading of the program. The pass must also keep the module well
formed, never add an op of any kind, give equal modules for equal input (every rank builds its
own module, so a pass that is not deterministic pairs different transfers across ranks), and, for
the settings in ``IDEMPOTENT``, leave its own output unchanged.
Unset, ``FUZZ_EXAMPLES`` keeps a small derandomized slice for ``make test``; ``make fuzz`` sets it.
"""

from __future__ import annotations

import fuzz_stats
import numpy as np
import pytest
import tvm
import tvm_ffi
from build_collectives_relax import build_module
from collective_spec import (
    IDEMPOTENT,
    PASS_SETTINGS,
    Program,
    Resolved,
    assert_outputs_equal,
    programs,
    random_inputs,
    reference,
    resolve,
    setting_passes,
)
from fuzz_spec import example_count, is_big_run
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from tvm import relax

import tvm_combiners.collectives.runtime  # noqa: F401 - registers the runtime functions
from tvm_combiners.collectives import relax as CR
from tvm_combiners.collectives.relax import combiners as CB
from tvm_combiners.compile.relax_runner import count_ops

KINDS = ("allreduce", "allgather", "reduce_scatter", "send", "recv")  # ours and TVM's ccl ops alike
#: The small slice ``make test`` runs per pass setting (derandomized); ``FUZZ_EXAMPLES`` scales it.
CI_EXAMPLES = 6
TARGET = tvm.target.Target({"kind": "llvm", "opt-level": 0})  # tiny modules compile twice as fast

SETTINGS = settings(
    max_examples=example_count(CI_EXAMPLES),
    deadline=None,
    derandomize=not is_big_run(),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


def make_pass(name: str) -> tvm.transform.Pass:
    return tvm.transform.Sequential(setting_passes(CB, name))


def _counts(mod: tvm.IRModule) -> dict[str, int]:
    counts = count_ops(mod)
    return {k: sum(n for op, n in counts.items() if op.endswith(k)) for k in KINDS}


def run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=CR.pipeline(TARGET))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return [o.numpy() for o in out]


def check_pass(name: str, program: Program, dataflow: bool) -> None:
    resolved = resolve(program)
    mod = build_module(resolved, dataflow)
    new = mod
    try:
        new = make_pass(name)(mod)
        changed = _check(name, resolved, dataflow, mod, new)
    except Exception as err:
        fuzz_stats.record("relax", name, 1, False, failed=f"{type(err).__name__}: {err}"[:300])
        if currently_in_test_context():  # the failing example's modules, printed with hypothesis's report
            note(f"before:\n{mod.script()}\nafter:\n{new.script()}")
        raise
    fuzz_stats.record("relax", name, 1, changed)


def _check(name: str, resolved: Resolved, dataflow: bool, mod: tvm.IRModule, new: tvm.IRModule) -> bool:
    relax.analysis.well_formed(new)  # raises on the first violation
    before, after = _counts(mod), _counts(new)
    assert all(after[k] <= before[k] for k in KINDS), f"an op was added: {before} -> {after}"
    again = make_pass(name)(build_module(resolved, dataflow))
    assert tvm_ffi.structural_equal(again, new), "not deterministic: two runs on equal modules differ"
    if name in IDEMPOTENT:
        assert tvm_ffi.structural_equal(make_pass(name)(new), new), "not idempotent: a second run changed the module"
    changed = not tvm_ffi.structural_equal(new, mod)
    if changed:
        inputs = random_inputs(resolved)
        want = run(mod, inputs)
        assert_outputs_equal(resolved, want, reference(resolved, inputs), "the unoptimized module vs numpy")
        assert_outputs_equal(resolved, run(new, inputs), want, "after the pass vs before")
    return changed


@pytest.mark.parametrize("name", list(PASS_SETTINGS))
def test_fuzz_collective_combiners_relax(name: str) -> None:
    @SETTINGS
    @given(programs(), st.booleans())
    def check(program: Program, dataflow: bool) -> None:
        check_pass(name, program, dataflow)

    check()
