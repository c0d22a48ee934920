"""Differential fuzzing of the Relay collective combiners: random channel-heavy programs, every pass.

The Relay twin of tests/fuzz/test_fuzz_collectives_relax.py, on the same programs
(``collective_spec``) and pass settings, on one rank. Each program is built in graph form (graph
executor) and as a let chain (Relay VM), each in two orders (``build_collectives_relay``):
"program" writes every channel's program order into the data, so the unoptimized module must
compute ``collective_spec.reference``; "loose" leaves the sends' order to OrderSendRecv (what the
combiners' past silent bug needed). Per pass setting: the pass keeps the module well formed and
typed, never adds an op of any kind, gives equal modules for equal input, leaves its own output
unchanged (the settings in ``IDEMPOTENT``), and, where it changed the module, the outputs are
bitwise equal before and after. A module that OrderSendRecv refuses must come back unchanged
(settings that combine transfers: raise its error). Unset, ``FUZZ_EXAMPLES`` keeps a small
derandomized slice for ``make test``; ``make fuzz`` sets it (modules per pass setting, shared out
among the four form/order targets).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import fuzz_stats
import numpy as np
import pytest
import tvm
from build_collectives_relay import FORMS, build_module
from collective_spec import (
    IDEMPOTENT,
    PASS_SETTINGS,
    Channel,
    Program,
    Resolved,
    Transfer,
    assert_outputs_equal,
    programs,
    random_inputs,
    reference,
    resolve,
    setting_passes,
)
from fuzz_spec import example_count, is_big_run
from hypothesis import HealthCheck, example, given, note, seed, settings
from hypothesis.control import currently_in_test_context
from test_relay_collective_combiners import P, _vm
from tvm import relay

import tvm_combiners.collectives.runtime  # noqa: F401 - registers the runtime functions
from tvm_combiners.collectives import relay as C
from tvm_combiners.collectives.ordering import SendRecvOrderError
from tvm_combiners.collectives.relay import combiners as CB
from tvm_combiners.compile.relay_runner import count_ops


def make_pass(name: str) -> tvm.transform.Pass:
    """The Relax fuzzer's pass settings, by the same names (the fuzz_stats tables line up)."""
    return tvm.transform.Sequential(setting_passes(CB, name))


#: Settings that combine sends and recvs: on a module OrderSendRecv refuses they raise its error.
COMBINES_TRANSFERS = {name for name, steps in PASS_SETTINGS.items()
                      if any(combiner in ("SendRecvCombiner", "CombineCollectives") for combiner, _ in steps)}
KINDS = tuple(f"collectives.{k}" for k in ("allreduce", "allgather", "reduce_scatter", "send", "recv"))
#: (form, order) of the modules each setting is checked on: program-ordered ones (their meaning
#: checked against numpy, too), and loose ones (the channels' send order is OrderSendRecv's reading).
TARGETS = [(form, order) for order in ("program", "loose") for form in FORMS]
#: Programs per pass setting in ``make test``'s slice (derandomized), shared out among the targets,
#: each of which also runs the two examples below: a Relay build of one module costs 1-5 s here.
#: ``FUZZ_EXAMPLES`` replaces it.
CI_EXAMPLES = 4
#: A big run's programs come from this seed (new each session), in every test alike, as the
#: derandomized slice's do: each program's unoptimized module is then built once for all settings.
BIG_RUN_SEED = random.SystemRandom().getrandbits(64)

#: Run first in every test. SWAPPED_SENDS: the combiners' past silent bug, whose loose modules the
#: pre-fix code combined wrongly (no OrderSendRecv before grouping: allreduce(x1) and allreduce(r1)
#: combined gave the second send of channel 1 a recv of it as an ancestor, and it went third).
#: BROAD: channels 1 and 2 open across two allreduces, two reduce_scatters and two allgathers that
#: combine, sends that combine across the channels, a send reading a recv of its own channel.
SWAPPED_SENDS = Program(
    params=(0, 0, 0),
    channels=(Channel(1, (Transfer(0, False),) * 3),),
    steps=((5, 4, 4), (0, 0, 1), (0, 35, 1), (0, 0, 1), (3, 0, 1), (5, 1, 4)),
)
BROAD = Program(
    params=(0, 0),
    channels=(Channel(1, (Transfer(0, False), Transfer(0, True), Transfer(0, False))),
              Channel(2, (Transfer(0, False), Transfer(0, False)))),
    steps=((0, 0, 1), (0, 1, 1), (5, 1, 4), (3, 0, 1), (0, 14, 0), (5, 4, 4), (10, 8, 0), (11, 12, 0), (8, 1, 0),
           (9, 16, 0), (3, 0, 0), (0, 1, 0)),
)

SETTINGS = settings(
    max_examples=-(-example_count(CI_EXAMPLES) // len(TARGETS)),
    deadline=None,
    derandomize=not is_big_run(),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


def for_programs(check_one: Callable[[Program], None]) -> None:
    """Run ``check_one`` on the session's programs. Every caller shares this one inner test, so all
    draw the same programs (derandomized by its source, or by :data:`BIG_RUN_SEED`)."""

    @SETTINGS
    @given(programs())
    @example(BROAD)
    @example(SWAPPED_SENDS)
    def check(program: Program) -> None:
        check_one(program)

    (seed(BIG_RUN_SEED)(check) if is_big_run() else check)()


#: Outputs of the modules already run, by form and structural hash: a program's unoptimized module
#: recurs in every pass setting, and settings often combine alike.
_RESULTS: dict[tuple[str, int, tuple[bytes, ...]], list[tuple[tvm.IRModule, list[np.ndarray]]]] = {}


def run(mod: tvm.IRModule, form: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Outputs on this rank: graph executor for graph form, the Relay VM (it keeps let order) for let form."""
    key = (form, tvm.ir.structural_hash(mod), tuple(a.tobytes() for a in inputs))
    seen = _RESULTS.setdefault(key, [])
    for old, outputs in seen:
        if tvm.ir.structural_equal(old, mod):
            return outputs
    outputs = P.run(mod, inputs) if form == "graph" else _vm(mod, inputs)
    seen.append((mod, outputs))
    return outputs


def _counts(mod: tvm.IRModule) -> dict[str, int]:
    counts = count_ops(mod, KINDS)
    return {k: counts[k] for k in KINDS}


def refused(mod: tvm.IRModule) -> bool:
    """Whether OrderSendRecv, which every combiner runs first, finds no order for the transfers."""
    try:
        C.OrderSendRecv()(mod)
    except SendRecvOrderError:
        return True
    return False


def check_pass(name: str, form: str, order: str, program: Program) -> None:
    resolved = resolve(program)
    mod = build_module(resolved, form, order)
    label = name if order != "none" else "(unordered recvs, accepted)"
    new = mod
    try:
        if refused(mod):
            _check_refused(name, mod)
            fuzz_stats.record("relay", f"(refused by OrderSendRecv: {order})", 1, False)
            return
        new = make_pass(name)(mod)
        changed = _check(name, form, order, resolved, mod, new)
    except Exception as err:
        fuzz_stats.record("relay", label, 1, False, failed=f"{form}/{order}: {type(err).__name__}: {err}"[:300])
        if currently_in_test_context():  # the failing example's modules, printed with hypothesis's report
            note(f"form {form}, order {order}\nbefore:\n{mod.astext(show_meta_data=False)}\n"
                 f"after:\n{new.astext(show_meta_data=False)}")
        raise
    fuzz_stats.record("relay", label, 1, changed)


def _check_refused(name: str, mod: tvm.IRModule) -> None:
    """No order, so no group may move a transfer: the module as it came, or OrderSendRecv's error."""
    if name in COMBINES_TRANSFERS:
        with pytest.raises(SendRecvOrderError):
            make_pass(name)(mod)
    else:
        assert make_pass(name)(mod).same_as(mod), "a module OrderSendRecv refuses was changed"


def _check(name: str, form: str, order: str, resolved: Resolved, mod: tvm.IRModule, new: tvm.IRModule) -> bool:
    assert relay.analysis.well_formed(new["main"]), "a variable is bound twice"
    relay.transform.InferType()(new)  # raises on a type error
    before, after = _counts(mod), _counts(new)
    assert all(after[k] <= before[k] for k in KINDS), f"an op was added: {before} -> {after}"
    again = make_pass(name)(build_module(resolved, form, order))
    assert tvm.ir.structural_equal(again, new), "not deterministic: two runs on equal modules differ"
    if name in IDEMPOTENT:
        assert tvm.ir.structural_equal(make_pass(name)(new), new), "not idempotent: a second run changed the module"
    changed = not tvm.ir.structural_equal(new, mod)
    if changed:
        inputs = random_inputs(resolved)
        want, got = run(mod, form, inputs), run(new, form, inputs)
        assert_outputs_equal(resolved, got, want, f"{form}/{order}, after the pass vs before")
    return changed


@pytest.mark.parametrize("form", FORMS)
def test_unoptimized_modules_mean_the_program(form: str) -> None:
    """Program-ordered modules are accepted by OrderSendRecv and compute what the program means,
    so a pass that keeps their outputs keeps the program's. Their outputs are kept: the
    differential tests below, on the same programs, build them no more."""

    def check_one(program: Program) -> None:
        resolved = resolve(program)
        mod = build_module(resolved, form)
        note(mod.astext(show_meta_data=False))
        assert not refused(mod), "OrderSendRecv refuses a program-ordered module"
        inputs = random_inputs(resolved)
        got, want = run(mod, form, inputs), reference(resolved, inputs)
        assert_outputs_equal(resolved, got[:len(want)], want, f"{form}, the unoptimized module vs numpy")
        assert len(got) - len(want) in (0, 1), "more than the one joint token"

    for_programs(check_one)


@pytest.mark.parametrize(("form", "order"), TARGETS, ids=[f"{f}-{o}" for f, o in TARGETS])
@pytest.mark.parametrize("name", list(PASS_SETTINGS))
def test_fuzz_collective_combiners_relay(name: str, form: str, order: str) -> None:
    for_programs(lambda program: check_pass(name, form, order, program))


def test_fuzz_unordered_recvs_relay() -> None:
    """Without the recv chains OrderSendRecv refuses nearly every program: each setting must then
    leave the module alone or raise its error (and pass the usual checks where it accepts one)."""

    def check_one(program: Program) -> None:
        for name in PASS_SETTINGS:
            check_pass(name, "graph", "none", program)

    for_programs(check_one)
