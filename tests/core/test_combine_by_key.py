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


def test_dependent_op_starts_a_new_group():
    g = build([(None, [], 1), ("sum", [0], 4), ("sum", [1], 4), ("sum", [0], 4), ("sum", [0], 4)])
    # node 2 reads node 1: the group {1} closes (alone: nothing), {2, 3, 4} forms
    assert combine_by_key(g, by_key) == [[2, 3, 4]]


def test_no_cycle_between_two_groups():
    # a0, b0 independent; a1 reads b0, b1 reads a0. Group A = {a0, a1} closes first, then B = {b0, b1}
    # would make A and B depend on each other, so b1 must start a new group.
    g = build([(None, [], 1), ("a", [0], 4), ("b", [0], 4), ("a", [2], 4), ("b", [1], 4)])
    assert combine_by_key(g, by_key) == [[1, 3]]


def test_bad_thresholds():
    g = build([])
    with pytest.raises(ValueError, match="threshold_bytes must be positive, got 0"):
        combine_by_key(g, by_key, threshold_bytes=0)
    with pytest.raises(ValueError, match="threshold_count must be >= 2, got 1"):
        combine_by_key(g, by_key, threshold_count=1)
