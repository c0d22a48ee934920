"""World-n reading of the collective fuzzer's programs (``collective_spec``): what every rank computes.

On one rank every collective is the identity, so a combiner that reorders an allgather's blocks,
hands a reduce_scatter's blocks to the wrong ranks or pairs a ring's sends wrongly cannot show.
Here a value is one array per rank, and

- allreduce reduces across ranks (in rank order) and every rank gets the result;
- allgather concatenates the ranks' operands along its axis in rank order;
- reduce_scatter reduces across ranks and rank r keeps block r along the axis;
- sends go around the ring (rank r sends to ``(r + 1) % n``), first in, first out per channel:
  rank r receives what rank ``(r - 1) % n`` sent.

Types. The programs assume a collective keeps its operand's type (true on one rank only), so the
n-rank module (``build_collectives_relax``) wraps the two collectives that change shapes, and this
reference computes the same wraps, op for op, in the same dtype and order:

- allgather is followed by an order-sensitive fold back to the operand type: block k (of n, along
  the axis) is weighted ``k + 1`` and the blocks are added in block order,
  ``((b0 * 1) + b1 * 2) + ...``. Weights differ per block, so a swap of two different blocks
  changes the result (a plain sum would hide it).
- reduce_scatter reads a tile of its operand: n copies along the axis, copy k offset by ``+k``.
  Its result has the operand's type again, and rank r's block is the reduction of ``x + r``:
  every rank's result differs, so a block handed to the wrong rank shows (a plain tile would give
  every rank the same block).

Exactness. Inputs are small integers. Every step is either one correctly rounded IEEE operation
(an add, a multiply by a small weight, an offset) or, on 2 ranks, a reduction of two operands
(one add, max or min, commutative), so numpy in the value's own dtype (float16 included) gives
TVM's bits even where a value has outgrown the dtype's exact integers. On more than 2 ranks a
float reduction's order would matter, so there every float must stay an exact integer; and an
int32 must never wrap (numpy wraps, LLVM may not). A program that breaks either is refused:
:func:`world_reference` raises :class:`Inexact`, and the fuzzer skips it (on every rank alike).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
from collective_spec import Op, Program, Resolved, programs, random_inputs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

#: Largest magnitude a float value may reach and stay an exact integer (n > 2 only), by dtype.
EXACT = {"float16": 2.0**11, "float32": 2.0**24}
INT32_LIMIT = 2**31 - 1

REDUCE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add, "max": np.maximum, "min": np.minimum,
}


class Inexact(ValueError):
    """The program leaves the range where the reference is bitwise exact on this world size."""


def rank_inputs(program: Resolved, rank: int, seed: int) -> list[np.ndarray]:
    """Rank ``rank``'s arguments: ``collective_spec``'s small integers, a different draw per rank."""
    return random_inputs(program, seed + 1000 * rank)


def draw_programs(count: int, seed: int) -> list[tuple[Program, bool]]:
    """``count`` (program, dataflow) pairs from ``collective_spec.programs()``, the same for a seed in
    every process: every rank builds the same modules, and the test recomputes their references.

    Drawn by hypothesis's generate phase alone (no database, no shrinking): the checks run outside
    hypothesis, since a failing rank that replayed or shrank alone would leave its peers waiting.
    """
    drawn: list[tuple[Program, bool]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate], derandomize=False,
              suppress_health_check=list(HealthCheck))  # the seed alone, whatever profile is loaded
    @given(programs(), st.booleans())
    def collect(program: Program, dataflow: bool) -> None:
        drawn.append((program, dataflow))

    collect()
    return drawn


def digest(arrays: list[np.ndarray]) -> str:
    """A short digest of outputs: dtype, shape and bytes of each, in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype}{a.shape};".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def gather_weight(block: int) -> int:
    """The weight of block ``block`` in the fold after an allgather."""
    return block + 1


def scatter_offset(copy: int) -> int:
    """What copy ``copy`` of the tile before a reduce_scatter adds to the operand."""
    return copy


def fold_gathered(gathered: np.ndarray, axis: int, n: int) -> np.ndarray:
    """The allgather's result back to its operand's type: blocks weighted ``k + 1``, added in order."""
    blocks = np.split(gathered, n, axis=axis)
    acc = blocks[0]
    for k in range(1, n):
        acc = acc + blocks[k] * gathered.dtype.type(gather_weight(k))
    return acc


def tile_for_scatter(x: np.ndarray, axis: int, n: int) -> np.ndarray:
    """n copies of ``x`` along ``axis``, copy k offset by ``+k``: what a reduce_scatter reads."""
    return np.concatenate([x if k == 0 else x + x.dtype.type(scatter_offset(k)) for k in range(n)], axis=axis)


def _reduce(arrays: list[np.ndarray], how: str) -> np.ndarray:
    acc = arrays[0]
    for a in arrays[1:]:
        acc = REDUCE[how](acc, a)
    return acc


def world_reference(program: Resolved, inputs: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Each rank's outputs (``inputs[r]``: rank r's arguments); raises :class:`Inexact` (see above)."""
    n = len(inputs)
    values: list[list[np.ndarray] | None] = [[inputs[r][i] for r in range(n)] for i in range(len(program.params))]
    queues: dict[int, list[list[np.ndarray]]] = {}
    for op in program.ops:
        args = [values[a] for a in op.args]
        out = _step(op, args, queues, n)
        if out is not None:
            for a in out:
                _check_range(a, n, op)
        values.append(out)
    return [[values[v][r] for v in program.outputs] for r in range(n)]  # type: ignore[index]


def _step(op: Op, args: list, queues: dict[int, list[list[np.ndarray]]], n: int) -> list[np.ndarray] | None:
    if op.kind == "send":
        queues.setdefault(op.channel, []).append(args[0])
        return None
    if op.kind == "recv":
        sent = queues[op.channel].pop(0)
        return [sent[(r - 1) % n] for r in range(n)]
    if op.kind == "add":
        return [_wide(np.add, args[0][r], args[1][r]) for r in range(n)]
    if op.kind == "offset":
        return [_wide(np.add, x, x.dtype.type(op.constant)) for x in args[0]]
    x = args[0]
    if op.kind == "allreduce":
        return [_reduce_wide(x, op.reduce)] * n
    if op.kind == "allgather":
        gathered = np.concatenate(x, axis=op.axis)
        _check_fold(gathered, op.axis, n, op)
        return [fold_gathered(gathered, op.axis, n)] * n
    if op.kind == "reduce_scatter":
        tiles = [tile_for_scatter(a, op.axis, n) for a in x]
        for t in tiles:
            _check_range(t, n, op)
        return list(np.split(_reduce_wide(tiles, op.reduce), n, axis=op.axis))
    raise AssertionError(f"unknown op kind {op.kind}")


def _wide(f: Callable[..., np.ndarray], *xs: np.ndarray) -> np.ndarray:
    """``f`` in the operands' dtype; an int32 result that would wrap raises :class:`Inexact`."""
    dtype = np.result_type(*xs)
    if dtype == np.int32:
        wide = f(*(np.asarray(a, np.int64) for a in xs))
        if np.abs(wide).max(initial=0) > INT32_LIMIT:
            raise Inexact("an int32 value would wrap")
        return wide.astype(np.int32)
    return f(*xs)


def _reduce_wide(arrays: list[np.ndarray], how: str) -> np.ndarray:
    if arrays[0].dtype == np.int32:
        wide = _reduce([a.astype(np.int64) for a in arrays], how)
        if np.abs(wide).max(initial=0) > INT32_LIMIT:
            raise Inexact("an int32 reduction would wrap")
        return wide.astype(np.int32)
    return _reduce(arrays, how)


def _check_fold(gathered: np.ndarray, axis: int, n: int, op: Op) -> None:
    """The fold's int32 partial sums must not wrap (its float ones are single IEEE steps)."""
    if gathered.dtype == np.int32:
        wide = fold_gathered(gathered.astype(np.int64), axis, n)
        if np.abs(wide).max(initial=0) > INT32_LIMIT:
            raise Inexact(f"{op.kind}: the fold of an int32 would wrap")


def _check_range(a: np.ndarray, n: int, op: Op) -> None:
    if n > 2 and str(a.dtype) in EXACT and not np.all(np.abs(a.astype(np.float64)) <= EXACT[str(a.dtype)]):
        raise Inexact(f"{op.kind}: a {a.dtype} value left the exact integers, and {n} ranks reduce in any order")
