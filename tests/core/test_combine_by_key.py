"""combine_by_key on neutral graphs: keys, thresholds, dependencies, cycles across groups."""

import pytest

from tvm_combiners.core import Graph
from tvm_combiners.core.combine_by_key import combine_by_key


def build(spec):
    """spec: list of (key or None, deps, elements); each node is float32 of that many elements."""
    g = Graph()
    for key, deps, elements in spec:
        g.add(op="op", operands=tuple(deps), deps=tuple(deps), shape=(elements,), dtype="float32",
              value_key=None if key is None else ("k", key))
    return g


def by_key(node):
    return None if node.value_key is None else node.value_key[1]


def test_equal_keys_group_and_others_do_not():
    g = build([(None, [], 1), ("sum", [0], 4), ("max", [0], 4), ("sum", [0], 4), (None, [1, 2, 3], 1)])
    assert combine_by_key(g, by_key) == [[1, 3]]


def test_thresholds_close_groups():
    g = build([(None, [], 1)] + [("sum", [0], 4)] * 5)  # five 16-byte ops
    assert combine_by_key(g, by_key, threshold_count=2) == [[1, 2], [3, 4]]
    assert combine_by_key(g, by_key, threshold_bytes=48) == [[1, 2, 3], [4, 5]]
    assert combine_by_key(g, by_key, threshold_bytes=15) == []  # each alone is larger than the limit


def test_thresholds_are_exact():
    g = build([(None, [], 1)] + [("sum", [0], 4)] * 3)  # three 16-byte ops
    assert combine_by_key(g, by_key, threshold_bytes=48) == [[1, 2, 3]]  # exactly at the limit
    assert combine_by_key(g, by_key, threshold_bytes=47) == [[1, 2]]  # one byte short: the third stays out
    assert combine_by_key(g, by_key, threshold_count=3) == [[1, 2, 3]]
    assert combine_by_key(g, by_key, threshold_bytes=16) == []  # each fills the limit alone


def test_dependent_op_does_not_end_the_group():
    g = build([(None, [], 1), ("sum", [0], 4), ("sum", [1], 4), ("sum", [0], 4), ("sum", [0], 4)])
    # node 2 reads node 1: it cannot join {1}, but 3 and 4 (independent, later) still do
    assert combine_by_key(g, by_key) == [[1, 3, 4]]


def test_chain_stays_apart_and_skip_ahead_joins_across_it():
    # allreduce -> add -> allreduce is a chain of two; a third, independent allreduce joins the first
    g = build([(None, [], 1), ("sum", [0], 4), (None, [1], 4), ("sum", [2], 4), ("sum", [0], 4)])
    assert combine_by_key(g, by_key) == [[1, 4]]
    g = build([(None, [], 1), ("sum", [0], 4), (None, [1], 4), ("sum", [2], 4)])
    assert combine_by_key(g, by_key) == []


def test_no_cycle_between_two_groups():
    # a0, b0 independent; a1 reads b0, b1 reads a0. Group A = {a0, a1} and B = {b0, b1} would
    # each be fine alone but depend on each other together: the exact walk keeps b1 out.
    g = build([(None, [], 1), ("a", [0], 4), ("b", [0], 4), ("a", [2], 4), ("b", [1], 4)])
    assert combine_by_key(g, by_key) == [[1, 3]]


def test_disabled_and_bad_thresholds():
    g = build([(None, [], 1)] + [("sum", [0], 4)] * 3)
    assert combine_by_key(g, by_key, threshold_bytes=0) == []
    assert combine_by_key(g, by_key, threshold_bytes=-1) == []
    assert combine_by_key(g, by_key, threshold_count=1) == []
    with pytest.raises(TypeError, match="threshold_bytes must be an int or None, got str '8'"):
        combine_by_key(g, by_key, threshold_bytes="8")


def test_deterministic_and_linear_shape():
    # 400 independent ops of two keys interleaved with a dependent chain: two groups, same every run
    spec = [(None, [], 1)]
    for i in range(400):
        spec.append(("sum" if i % 2 else "max", [0], 4))
    g = build(spec)
    first = combine_by_key(g, by_key, threshold_count=256)
    assert first == combine_by_key(g, by_key, threshold_count=256)
    assert [len(m) for m in first] == [200, 200]


def test_members_without_inputs_still_order_their_users():
    # r0, r1 read nothing (a recv with a fresh token); a: reads r0, opens key "x"; b reads a and is
    # key "y" like r1... Grouping {r0, r1} (key y) and {a, c} (key x) where r1 reads c would cycle:
    # the proof must see r0's users even though r0 itself has no inputs.
    g = build([("y", [], 4), ("x", [0], 4), ("x", [], 4), ("y", [2], 4), (None, [1, 3], 1)])
    groups = combine_by_key(g, by_key)
    # {0, 3} (y) and {1, 2} (x): 1 reads 0 and 3 reads 2 -> the two groups would depend on each other
    assert groups in ([[0, 3]], [[1, 2]])


def test_a_cycle_contracts_only_around_its_groups(contractions):
    """The cycle above, then 30 allreduce pairs of other keys: only the cycle's groups contract, and
    the groups are the exact walk's."""
    import importlib

    module = importlib.import_module("tvm_combiners.core.combine_by_key")  # the package exports the function

    spec = [(None, [], 1), ("a", [0], 4), ("b", [0], 4), ("a", [2], 4), ("b", [1], 4)]
    for i in range(30):
        spec += [(f"k{i}", [0], 4), (f"k{i}", [0], 4)]
    g = build(spec)
    groups = combine_by_key(g, by_key)
    assert contractions == [[1, 3]]  # every join the exact way: 31
    exact = module._walk(g, [by_key(n) for n in g.nodes], None, None, contract=lambda members: True)
    assert groups == exact and groups[0] == [1, 3] and len(groups) == 31


def test_pairs_group_by_stage():
    """Members of two stages, (send, recv) with the edge send -> recv: a recv may read the group's
    sends, but a send that reads its recvs, or a recv that reads its recvs (also one walked
    earlier), joins another group."""
    import importlib

    module = importlib.import_module("tvm_combiners.core.combine_by_key")
    g = build([(None, [], 1),
               (None, [0], 4), (None, [1], 4),  # 1 -> 2: pair A
               (None, [0], 4), (None, [3, 1], 4),  # 3 -> 4, the recv reads send 1: joins A
               (None, [2], 4), (None, [5], 4),  # 5 -> 6, the send reads recv 2: opens B
               (None, [0], 4), (None, [7, 4], 4),  # 7 -> 8, the recv reads recv 4: joins B
               (None, [0], 4), (None, [9], 4),  # 9 -> 10, independent: joins A, the oldest
               (None, [0], 4), (None, [0], 4), (None, [12], 4),  # 11 -> 14 reads 12 -> 13
               (None, [11, 13], 4)])
    pairs = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (12, 13), (11, 14)]

    def walk(contract=None, count=None, order=pairs):
        members = [module.Member("send", pair, 16) for pair in order]
        return module.group_by_key(g, members, None, count, contract)

    groups = [[[1, 3, 9, 12], [2, 4, 10, 13]], [[5, 7, 11], [6, 8, 14]]]
    assert walk() == walk(lambda nodes: True) == groups
    assert walk(count=2) == [[[1, 3], [2, 4]], [[5, 7], [6, 8]], [[9, 12], [10, 13]]]
    # 11 -> 14 walked before 12 -> 13: the group's recv 14 reads recv 13, so 12 -> 13 stays out
    assert walk(order=[(11, 14), (12, 13)]) == []
