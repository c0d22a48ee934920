"""IR-neutral specs of random parallel-branch graphs, and the hypothesis strategies that draw them.

A spec is plain frozen data, so hypothesis shrinks it and prints it readably; the Relax builder
(``tests/fuzz/build_relax.py``) and the Relay builder (``tests/relay/fuzz/build_relay.py``) turn
the same spec into modules. Both environments import this file (it needs no TVM).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import strategies as st

#: Root families and the source shapes they read.
FAMILIES = ("matmul", "batch_matmul", "conv2d")

FLOAT_UNARY = ("relu", "sigmoid", "tanh", "gelu", "silu", "negative", "abs", "square")
INT_UNARY = ("negative", "abs")
BINARY = ("add", "subtract", "multiply", "maximum", "minimum", "divide")
#: Side operands of binary followers (and of ``where``): what they broadcast over.
SIDE_SHAPES = ("scalar", "channel", "other", "full")


@dataclass(frozen=True)
class Side:
    """A binary follower's other operand: its shape kind, constant or parameter, shared or per branch."""

    shape: str  # scalar | channel (one value per output column/channel) | other (broadcast over channels) | full
    # | prim (Relax only: an ``R.prim_value`` scalar, which the combiners see as no operand)
    const: bool
    shared: bool  # one object for every branch that asks for the same shape (else one per branch)
    left: bool  # the side operand comes first: f(side, y)


@dataclass(frozen=True)
class Follower:
    op: str  # a unary op, a binary op, clip, where, cast, reshape, bias_add
    side: Side | None = None


@dataclass(frozen=True)
class Source:
    """A branch's data input: a parameter, an equal reshape of one, or an op over a small operand pool.

    ``picks`` index the pool; repeated and permuted picks (``f(a, a, b)`` beside ``f(a, b, b)``)
    give inputs that differ only in the order or repetition of their operands.
    """

    family: str
    kind: str  # param | copy | concat | layer_norm
    picks: tuple[int, ...] = ()
    of: int = 0  # copy: the source index it reshapes (a param source of the same family)


@dataclass(frozen=True)
class Branch:
    source: int
    width: int  # output columns (matmul) or channels (conv2d)
    kernel: int  # conv2d kernel size (1, 3, 5)
    weight: str  # const | param
    transposed: bool  # Relax: permute_dims(W); Relay: dense vs nn.matmul, transpose_b for batch_matmul
    followers: tuple[Follower, ...]
    dep: int | None  # an earlier branch whose output perturbs this branch's weight (a dependency)
    out_root: bool  # the root itself is also an output
    tap: bool = False  # the first follower's result is also an output (a use outside the chain)
    input_transposed: bool = False  # Relay batch_matmul, 2-D nn.matmul: transpose(source) with transpose_a


@dataclass(frozen=True)
class GraphSpec:
    dtype: str
    symbolic: bool  # matmul / batch_matmul sources have a symbolic row count
    layout: str  # conv2d: NCHW | NHWC
    stride: int
    batch: int  # batch of batch_matmul sources (1 lets to_batch stack them)
    rank3: bool  # matmul sources are [batch, rows, K] (a 2-D weight over 3-D activations)
    sources: tuple[Source, ...]
    branches: tuple[Branch, ...]


@dataclass(frozen=True)
class ModuleSpec:
    graphs: tuple[GraphSpec, ...]
    calls: bool  # each graph is a global function that main calls (else all graphs inline in main)
    seed: int

    def count(self) -> int:
        return len(self.graphs)


@dataclass(frozen=True)
class Options:
    min_num_branches: int = 2
    max_branches: int | None = None
    max_combined_bytes: int | None = None
    to_batch: bool = False

    def kwargs(self) -> dict:
        return {"min_num_branches": self.min_num_branches, "max_branches": self.max_branches,
                "max_combined_bytes": self.max_combined_bytes, "to_batch": self.to_batch}


# Fixed sizes keep compile times low; the interesting variety is in the structure.
M_ROWS = 3  # rows of matmul inputs (the run-time value of the symbolic dim too)
K_PIECE = 2  # concat sources join three pieces of this width: K = 3 * K_PIECE
K = 3 * K_PIECE
IMAGE = 6  # conv2d images are IMAGE x IMAGE
C_PIECE = 1
CHANNELS = 3 * C_PIECE


def example_count(default: int) -> int:
    """``FUZZ_EXAMPLES`` scales every fuzz test (``make fuzz``); unset, the small CI slice runs."""
    return int(os.environ.get("FUZZ_EXAMPLES", default))


def is_big_run() -> bool:
    return "FUZZ_EXAMPLES" in os.environ


def _floaty(dtype: str) -> bool:
    return dtype.startswith("float")


@st.composite
def sides(draw, channel_ok: bool = True) -> Side:
    shapes = SIDE_SHAPES if channel_ok else ("scalar", "other", "full")
    return Side(draw(st.sampled_from(shapes)), draw(st.booleans()), draw(st.booleans()), draw(st.booleans()))


@st.composite
def followers(draw, ir: str, dtype: str, family: str) -> Follower:
    kinds = ["unary", "binary", "clip", "where", "cast", "reshape"]
    if ir == "relay":
        kinds.append("bias_add")
    kind = draw(st.sampled_from(kinds))
    if kind == "unary":
        return Follower(draw(st.sampled_from(FLOAT_UNARY if _floaty(dtype) else INT_UNARY)))
    if kind == "binary":
        ops = BINARY if _floaty(dtype) else BINARY[:-1]
        op = draw(st.sampled_from(ops))
        side = draw(sides())
        if ir == "relax" and draw(st.integers(0, 4)) == 0:  # a prim value: an attribute-like arg, not an operand
            side = Side("prim", True, side.shared, side.left)
        if op == "divide" and side.left:  # dividing by a branch's output amplifies rounding: keep y on top
            side = Side(side.shape, side.const, side.shared, False)
        return Follower(op, side)
    if kind == "where":
        return Follower("where", draw(sides()))
    if kind == "bias_add":
        return Follower("bias_add", Side("channel", draw(st.booleans()), draw(st.booleans()), False))
    return Follower(kind)


@st.composite
def graph_specs(draw, ir: str, families: tuple[str, ...], dtypes: tuple[str, ...]) -> GraphSpec:
    dtype = draw(st.sampled_from(dtypes))
    allowed = [f for f in families if f != "conv2d" or _floaty(dtype) or dtype == "int8"] or ["matmul"]
    n_sources = draw(st.sampled_from([1, 2, 2, 3]))  # few sources: more branches share one
    sources: list[Source] = []
    for _ in range(n_sources):
        pooled = [s for s in sources if s.kind in ("concat", "layer_norm")]
        if pooled and draw(st.integers(0, 3)):
            # a sibling of an earlier source over the same operands in another order or multiplicity:
            # f(a, a, b) beside f(a, b, b), the inputs value numbering must keep apart
            like = pooled[-1]
            a, _, c = like.picks
            shifted = (a, c, c) if like.picks != (a, c, c) else (a, a, c)
            anyhow = st.lists(st.sampled_from(sorted(set(like.picks))), min_size=3, max_size=3).map(tuple)
            picks = shifted if draw(st.integers(0, 3)) else draw(anyhow)
            sources.append(Source(like.family, like.kind, picks))
            continue
        family = draw(st.sampled_from(allowed))
        kinds = ["param", "concat"] + (["layer_norm"] if _floaty(dtype) and family != "conv2d" else [])
        earlier = [j for j, s in enumerate(sources) if s.kind == "param" and s.family == family]
        if earlier:
            kinds.append("copy")
        kind = draw(st.sampled_from(kinds))
        if kind in ("concat", "layer_norm"):  # over a pool of three operands, repeats allowed
            sources.append(Source(family, kind, tuple(draw(st.lists(st.integers(0, 2), min_size=3, max_size=3)))))
        elif kind == "copy":
            sources.append(Source(family, "copy", of=draw(st.sampled_from(earlier))))
        else:
            sources.append(Source(family, "param"))
    n_branches = draw(st.integers(1, 6))
    common = None
    branches: list[Branch] = []
    for i in range(n_branches):
        src = draw(st.integers(0, n_sources - 1))
        family = sources[src].family
        chain = st.lists(followers(ir, dtype, family), max_size=3).map(tuple)
        if common is None:
            common = draw(chain)
        branches.append(Branch(
            source=src,
            width=draw(st.integers(1, 4)),
            kernel=draw(st.sampled_from([1, 3, 5])) if family == "conv2d" else 1,
            weight=draw(st.sampled_from(["const", "const", "param"])),
            transposed=draw(st.booleans()),
            followers=common if draw(st.integers(0, 3)) else draw(chain),  # branches mostly agree
            dep=draw(st.integers(0, i - 1)) if i and draw(st.integers(0, 7)) == 0 else None,
            out_root=draw(st.integers(0, 7)) == 0,
            tap=draw(st.integers(0, 7)) == 0,
            input_transposed=ir == "relay" and family in ("matmul", "batch_matmul") and draw(st.booleans()),
        ))
    return GraphSpec(
        dtype=dtype,
        symbolic=draw(st.integers(0, 4)) == 0,
        layout=draw(st.sampled_from(["NCHW", "NHWC"])),
        stride=draw(st.sampled_from([1, 1, 2])),
        batch=draw(st.sampled_from([1, 2])),
        rank3=draw(st.integers(0, 3)) == 0,
        sources=tuple(sources),
        branches=tuple(branches),
    )


@st.composite
def module_specs(draw, ir: str, families: tuple[str, ...], dtypes: tuple[str, ...], calls_ok: bool = True,
                 max_graphs: int | None = None) -> ModuleSpec:
    if max_graphs is None:
        max_graphs = 5 if is_big_run() else 2  # the CI slice stays within its time
    graphs = tuple(draw(st.lists(graph_specs(ir, families, dtypes), min_size=1, max_size=max_graphs)))
    return ModuleSpec(graphs, calls=calls_ok and draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@st.composite
def options(draw, family_pass: str) -> Options:
    least = draw(st.sampled_from([2, 2, 2, 3]))
    return Options(
        min_num_branches=least,
        max_branches=draw(st.sampled_from([None, None, least, least + 1])),
        max_combined_bytes=draw(st.sampled_from([None, None, None, 64, 256, 4096])),
        to_batch=draw(st.booleans()) if family_pass in ("matmul", "batch_matmul", "ops") else False,
    )


def explicit_cases(family: str) -> list[tuple[ModuleSpec, Options]]:
    """Hand-picked modules every run checks first (the CI slice included): each combines.

    Three siblings with shared and per-branch side operands on either side, a tap, a dependent
    fourth branch; inputs over repeated and permuted operands; a call with siblings beside main's.
    """
    root = {"ops": "matmul"}.get(family, family)
    side_own = Side("channel", const=True, shared=False, left=True)
    side_shared = Side("scalar", const=False, shared=True, left=False)
    chain = (Follower("add", side_own), Follower("relu"), Follower("multiply", side_shared))
    branches = tuple(Branch(0, w, k, "const", bool(i % 2), chain, None, False, tap=i == 0)
                     for i, (w, k) in enumerate(((2, 1), (3, 3), (1, 5))))
    dependent = Branch(0, 2, 3, "param", False, (Follower("clip"),), 0, True)
    plain = GraphSpec("float32", False, "NCHW", 1, 1, False, (Source(root, "param"),), (*branches, dependent))
    kind = "concat" if root == "conv2d" else "layer_norm"
    sources = (Source(root, kind, (0, 0, 1)), Source(root, kind, (0, 1, 0)), Source(root, kind, (0, 0, 1)))
    pooled = GraphSpec("float32", root != "conv2d", "NHWC", 1, 1, False, sources,
                       tuple(Branch(i, 2 + i, 1, "const", False, (Follower("sigmoid"),), None, False) for i in range(3)))
    mixed = GraphSpec("float16", False, "NCHW", 2, 1, False, (Source("conv2d", "param"), Source("matmul", "param")),
                      tuple(Branch(i % 2, 2, 3, "const", False, (Follower("cast"),), None, False) for i in range(4)))
    graphs = (plain, pooled, mixed) if family == "ops" else (plain, pooled)
    return [(ModuleSpec(graphs, calls=False, seed=1), Options()),
            (ModuleSpec(graphs, calls=True, seed=2), Options(max_branches=2))]
