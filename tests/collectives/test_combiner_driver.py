"""The collective combiners' IR-neutral driver, on hand-built units (no IR): what each step decides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_combiners.collectives.combiners.driver import Unit, _pinned_deps, plan_combining
from tvm_combiners.collectives.combiners.keys import PASS_KINDS, ChannelBook
from tvm_combiners.collectives.combiners.options import CombinerOptions
from tvm_combiners.collectives.ordering import OrderNode

AR = ("allreduce", "sum", None, "float32")
PAIRS = ((0, 1), (1, 0))
HOST = ("transfer", PAIRS, True)
DEVICE = ("transfer", PAIRS, False)


@dataclass(frozen=True)
class Op:
    family: str
    key: Any
    shape: tuple[int, ...] = (4,)
    dtype: str = "float32"


def options(families: tuple[str, ...] = PASS_KINDS) -> CombinerOptions:
    return CombinerOptions("CombineCollectives", families, 1 << 20, 64, True, None, None)


def book(*functions: tuple[int, ...]) -> ChannelBook:
    return ChannelBook(lambda: functions)


def allreduce(*deps: int, **flags: bool) -> Unit:
    return Unit(deps, Op("allreduce", AR), before_barrier=True, after_barrier=True, **flags)


def send(channel: int, *deps: int, key: Any = DEVICE) -> Unit:
    return Unit(deps, Op("send", key), OrderNode("send", (), channel, PAIRS), before_barrier=True, after_barrier=True)


def recv(channel: int, *deps: int, key: Any = DEVICE) -> Unit:
    return Unit(deps, Op("recv", key), OrderNode("recv", (), channel, PAIRS), before_barrier=True, after_barrier=True)


def other(*deps: int, **flags: bool) -> Unit:
    return Unit(deps, **flags)


def test_independent_collectives_combine_and_only_those_the_pass_combines():
    units = [other(), allreduce(0), allreduce(0)]
    plan = plan_combining(units, options(), book())
    assert plan is not None and plan.groups == [[1, 2]]
    assert plan_combining(units, options(("allgather",)), book()) is None


def test_no_collective_crosses_a_barrier():
    units = [allreduce(), other(barrier=True), allreduce()]
    assert plan_combining(units, options(), book()) is None
    assert plan_combining([allreduce(), other(), allreduce()], options(), book()).groups == [[0, 2]]


def test_program_order_recv_before_its_send_changes_nothing_topological_order_moves_the_send():
    # unit 0 a recv, unit 2 its send: as listed (Relax) a deadlock for OrderSendRecv to fix; in a
    # topological order (Relay) the send -> recv edge moves the send first
    units = [recv(0), allreduce(), send(0), allreduce()]
    assert plan_combining(units, options(), book((0,))) is None
    plan = plan_combining(units, options(), book((0,)), topological=True)
    assert plan is not None and plan.groups == [[1, 3]]
    assert sorted(u for u in plan.order if u >= 0) == [0, 2]  # unit indices, not run-order positions
    assert plan.order.index(2) < plan.order.index(0)


def test_transfers_on_two_channels_combine_unless_a_channel_is_shared():
    units = [other(), send(0, 0), send(1, 0), recv(0), recv(1)]
    plan = plan_combining(units, options(), book((0, 0, 1, 1)))
    assert plan is not None and plan.transfers == [([1, 2], [3, 4])]
    assert plan_combining(units, options(), book((0, 0, 1, 1), (1, 1))) is None


def test_hidden_transfers_change_nothing_where_the_region_has_transfers():
    with_transfers = [send(0), recv(0), allreduce(), allreduce()]
    assert plan_combining(with_transfers, options(), book((0, 0)), topological=True, hidden_transfers=True) is None
    without = [allreduce(), allreduce()]
    assert plan_combining(without, options(), book(), topological=True, hidden_transfers=True).groups == [[0, 1]]


def test_ends_share_key_keeps_a_transfer_whose_ends_disagree_alone():
    units = [other(), send(0, 0), send(1, 0), recv(0, key=HOST), recv(1)]
    assert plan_combining(units, options(), book((0, 0, 1, 1))).transfers == [([1, 2], [3, 4])]
    assert plan_combining(units, options(), book((0, 0, 1, 1)), ends_share_key=True) is None


def test_a_call_of_a_transfer_holding_function_pins_transfers_on_shared_channels_only():
    units = [send(3), other(calls_transfers=True), recv(3)]
    assert _pinned_deps(units, book((3, 3), (3,))) == [set(), {0}, {1}]
    assert _pinned_deps(units, book((3, 3))) == [set(), set(), set()]
