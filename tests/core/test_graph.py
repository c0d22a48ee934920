"""The neutral graph: value numbering keys on ordered operands, op and type; sizes by dtype bits."""

from tvm_combiners.core import Graph


def _leaf(g, shape=(4, 8), dtype="float32"):
    return g.add(op="param", operands=(), deps=(), shape=shape, dtype=dtype).index


def _op(g, *deps, key=("f",), shape=(4, 8), dtype="float32"):
    return g.add(op="f", operands=tuple(deps), deps=tuple(deps), shape=shape, dtype=dtype, value_key=key).index


def test_repeated_operands_are_not_one_value():
    g = Graph()
    a, b = _leaf(g), _leaf(g)
    aab, abb, aab2 = _op(g, a, a, b), _op(g, a, b, b), _op(g, a, a, b)
    numbers = g.value_numbers()
    assert numbers[aab] != numbers[abb]
    assert numbers[aab] == numbers[aab2]


def test_order_type_and_key_all_count():
    g = Graph()
    a, b = _leaf(g), _leaf(g)
    ab, ba = _op(g, a, b), _op(g, b, a)
    f16 = _op(g, a, b, dtype="float16")
    wide = _op(g, a, b, shape=(4, 9))
    other = _op(g, a, b, key=("g",))
    numbers = g.value_numbers()
    assert len({numbers[n] for n in (ab, ba, f16, wide, other)}) == 5


def test_leaves_without_key_are_only_equal_to_themselves():
    g = Graph()
    a, b = _leaf(g), _leaf(g)
    numbers = g.value_numbers()
    assert numbers[a] != numbers[b]


def test_dtype_bits_and_sizes():
    from tvm_combiners.core.graph import parse_dtype_bits

    expected = {"float32": 32, "int8x4": 32, "float8_e4m3fn": 8, "float8_e5m2x4": 32, "float4_e2m1fn": 4,
                "bfloat16": 16, "bool": 8, "uint1": 1}
    assert {d: parse_dtype_bits(d) for d in expected} == expected
    g = Graph()
    assert g[_leaf(g, (3, 5), "float4_e2m1fn")].nbytes == 8  # 15 half-bytes round up once
    assert g[_leaf(g, (3, 5), "float8_e4m3fn")].nbytes == 15
    h = Graph(dtype_bits=lambda d: 16)  # an IR's own answer wins over the string
    assert h[_leaf(h, (3, 5), "float32")].nbytes == 30


def test_contracting_groups_one_by_one_equals_the_fixed_point():
    """Reachability.contract updates ancestor sets in one pass; over random DAGs and random
    sequences of groups the planners could form (no member reads another, in the contracted view;
    some merging with earlier groups, as the transfer grouping grows its groups), the sets equal
    what the fixed point recomputes from scratch after every group."""
    import random

    from tvm_combiners.core import Reachability

    checked = 0
    for seed in range(60):
        rng = random.Random(seed)
        g = Graph()
        for i in range(rng.randint(8, 40)):
            deps = tuple(sorted(rng.sample(range(i), min(i, rng.randint(0, 3))))) if i else ()
            g.add(op="f", operands=deps, deps=deps, shape=(2,), dtype="float32")
        reach = Reachability(g)
        groups: list[list[int]] = []
        for _ in range(rng.randint(1, 6)):
            base = list(rng.choice(groups)) if groups and rng.random() < 0.3 else []
            pool = list(range(len(g)))
            rng.shuffle(pool)
            members = base
            for n in pool:
                if len(members) >= len(base) + rng.randint(1, 3):
                    break
                bits = sum(1 << m for m in members)
                if n in members or reach.depends_on_any(n, bits) or any(reach.depends_on_any(m, 1 << n) for m in members):
                    continue
                members.append(n)
            if len(members) < 2:
                continue
            reach.contract(members)
            groups.append(members)
            fresh = list(reach._ancestors)
            reach._recompute()
            assert fresh == reach._ancestors, (seed, groups)
            checked += 1
    assert checked > 100
