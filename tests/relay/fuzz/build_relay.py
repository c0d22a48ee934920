"""Turn a :mod:`fuzz_spec` module spec into a Relay module and matching random inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from fuzz_spec import C_PIECE, IMAGE, K_PIECE, M_ROWS, Follower, GraphSpec, K, ModuleSpec, Side
from tvm import relay

#: Relay op per family root (dense also stands for nn.matmul).
ROOT_OPS = {"matmul": ("nn.dense", "nn.matmul"), "batch_matmul": ("nn.batch_matmul",), "conv2d": ("nn.conv2d",)}
CAST_TO = {"float32": "float16", "float16": "float32", "int32": "float32"}
#: The spec's unary names, mapped onto Relay ops that are followers too (Relay has no gelu/silu/square op).
UNARY = {"relu": relay.nn.relu, "sigmoid": relay.sigmoid, "tanh": relay.tanh, "gelu": relay.erf,
         "silu": lambda y: relay.nn.leaky_relu(y, alpha=0.1), "negative": relay.negative, "abs": relay.abs,
         "square": relay.floor}
#: The VM needs a shape function for every op over a ``?`` shape; erf and abs have none in TVM 0.16.
NO_SHAPE_FUNC = {"gelu": lambda y: relay.Call(relay.op.get("fast_tanh"), [y]), "abs": relay.negative}
BINARY = {"add": relay.add, "subtract": relay.subtract, "multiply": relay.multiply, "maximum": relay.maximum,
          "minimum": relay.minimum, "divide": relay.divide}


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("int"):
        return rng.integers(-3, 4, shape).astype(dtype)
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


def _static(shape: tuple) -> bool:
    return all(isinstance(d, int) for d in shape)


class _GraphBuilder:
    """Builds one graph's expressions; parameters are created on demand."""

    def __init__(self, spec: GraphSpec, rng: np.random.Generator, prefix: str) -> None:
        self.spec, self.rng, self.prefix = spec, rng, prefix
        self.params: list[relay.Var] = []
        self.m = relay.Any() if spec.symbolic else M_ROWS
        self.shared: dict[Any, relay.Expr] = {}

    def param(self, shape: tuple, dtype: str) -> relay.Var:
        var = relay.var(f"{self.prefix}p{len(self.params)}", shape=shape, dtype=dtype)
        self.params.append(var)
        return var

    def leaf(self, shape: tuple, dtype: str, const: bool) -> relay.Expr:
        if const and _static(shape):
            return relay.const(random_array(shape, dtype, self.rng), dtype)
        return self.param(shape, dtype)

    def once(self, key: Any, make: Any) -> relay.Expr:
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]

    def data_shape(self, family: str, width: int) -> tuple:
        if family == "matmul":  # rank3 is ignored: x86 dense in TVM 0.16 computes 2-D data only
            return (self.m, width)
        if family == "batch_matmul":
            return (self.spec.batch, self.m, width)
        return (1, width, IMAGE, IMAGE) if self.spec.layout == "NCHW" else (1, IMAGE, IMAGE, width)

    def out_shape(self, family: str, width: int) -> tuple:
        if family != "conv2d":
            return (*self.data_shape(family, K)[:-1], width)
        size = (IMAGE - 1) // self.spec.stride + 1
        return (1, width, size, size) if self.spec.layout == "NCHW" else (1, size, size, width)

    def channel_axis(self, family: str) -> int:
        return 1 if family == "conv2d" and self.spec.layout == "NCHW" else -1

    def side_shape(self, family: str, kind: str, out: tuple) -> tuple:
        if kind == "scalar":
            return ()
        if kind == "full":
            return out
        if family == "conv2d":
            nchw = self.spec.layout == "NCHW"
            c = out[1] if nchw else out[3]
            h, w = (out[2], out[3]) if nchw else (out[1], out[2])
            if kind == "channel":
                return (c, 1, 1) if nchw else (c,)
            return (1, 1, h, w) if nchw else (h, w, 1)
        if kind == "channel":
            return (out[-1],)
        return (*out[:-1], 1)

    def reshape_same(self, y: relay.Expr, shape: tuple) -> relay.Expr:
        return relay.reshape(y, [d if isinstance(d, int) else -1 for d in shape])

    # sources ------------------------------------------------------------------------------
    def source(self, index: int) -> relay.Expr:
        return self.once(("source", index), lambda: self._make_source(index))

    def _make_source(self, index: int) -> relay.Expr:
        src, dtype = self.spec.sources[index], self.spec.dtype
        width = K if src.family != "conv2d" else 3 * C_PIECE
        if src.kind == "param":
            return self.param(self.data_shape(src.family, width), dtype)
        if src.kind == "copy":
            return self.reshape_same(self.source(src.of), self.data_shape(src.family, width))
        if src.kind == "concat":
            piece = K_PIECE if src.family != "conv2d" else C_PIECE
            pool = [self.once(("pool", src.family, i), lambda: self.param(self.data_shape(src.family, piece), dtype))
                    for i in range(3)]
            return relay.concatenate([pool[i] for i in src.picks], axis=self.channel_axis(src.family))
        vectors = [self.once(("vector", i), lambda: self.param((K,), dtype)) for i in range(3)]
        a, g, b = (vectors[i] for i in src.picks)
        base = self.once(("base", src.family), lambda: self.param(self.data_shape(src.family, K), dtype))
        return relay.add(base, relay.nn.layer_norm(a, g, b, axis=-1))

    # branches -----------------------------------------------------------------------------
    def side(self, family: str, side: Side, out: tuple, dtype: str, branch: int) -> relay.Expr:
        shape = self.side_shape(family, side.shape, out)
        key = ("side", side.shape, side.const, tuple(str(d) for d in shape), dtype)
        if not side.shared:
            key = (*key, branch)
        return self.once(key, lambda: self.leaf(shape, dtype, side.const))

    def follower(self, f: Follower, y: relay.Expr, dtype: str, family: str, out: tuple,
                 branch: int) -> tuple[relay.Expr, str]:
        if f.op in UNARY:
            if self.spec.symbolic and f.op in NO_SHAPE_FUNC:
                return NO_SHAPE_FUNC[f.op](y), dtype
            return UNARY[f.op](y), dtype
        if f.op == "clip":
            return relay.clip(y, -1.0, 1.0), dtype
        if f.op == "cast":
            return relay.cast(y, CAST_TO[dtype]), CAST_TO[dtype]
        if f.op == "reshape":
            return self.reshape_same(y, out), dtype
        if f.op == "where":
            cond = self.side(family, f.side, out, "bool", branch)
            other = relay.const(np.array(0.5 if dtype.startswith("float") else 1, dtype))
            args = (other, y) if f.side.left else (y, other)
            return relay.where(cond, *args), dtype
        if f.op == "bias_add":
            axis = self.channel_axis(family) % len(out)
            key = ("bias", out[axis], f.side.const, dtype) + (() if f.side.shared else (branch,))
            bias = self.once(key, lambda: self.leaf((out[axis],), dtype, f.side.const))
            return relay.nn.bias_add(y, bias, axis=axis), dtype
        side = self.side(family, f.side, out, dtype, branch)
        return (BINARY[f.op](side, y) if f.side.left else BINARY[f.op](y, side)), dtype

    def weight(self, family: str, width: int, kernel: int, kind: str, transposed: bool) -> relay.Expr:
        dtype = self.spec.dtype
        if family == "conv2d":
            c = 3 * C_PIECE
            shape = (width, c, kernel, kernel) if self.spec.layout == "NCHW" else (kernel, kernel, c, width)
            return self.leaf(shape, dtype, kind == "const")
        if family == "batch_matmul":
            b = self.spec.batch
            return self.leaf((b, width, K) if transposed else (b, K, width), dtype, kind == "const")
        return self.leaf((K, width) if transposed else (width, K), dtype, kind == "const")

    def emit(self) -> list[relay.Expr]:
        spec = self.spec
        outs: list[relay.Expr] = []
        finals: list[tuple[relay.Expr, str]] = []
        for i, br in enumerate(spec.branches):
            family = spec.sources[br.source].family
            data = self.source(br.source)
            w = self.weight(family, br.width, br.kernel, br.weight, br.transposed)
            if br.dep is not None:
                prev = finals[br.dep][0]
                w = relay.add(w, relay.cast(relay.max(prev), spec.dtype))
            if family == "conv2d":
                nchw = spec.layout == "NCHW"
                y = relay.nn.conv2d(data, w, strides=(spec.stride, spec.stride), padding=(br.kernel // 2,) * 2,
                                    channels=br.width, kernel_size=(br.kernel, br.kernel),
                                    data_layout=spec.layout, kernel_layout="OIHW" if nchw else "HWIO")
            elif family == "batch_matmul" and br.input_transposed:  # the same product, read as [b, K, M]
                y = relay.nn.batch_matmul(relay.transpose(data, (0, 2, 1)), w, transpose_a=True, transpose_b=br.transposed)
            elif family == "batch_matmul":
                y = relay.nn.batch_matmul(data, w, transpose_b=br.transposed)
            elif br.transposed and br.input_transposed and not spec.rank3 and not spec.symbolic:
                # not over ? rows: TVM 0.16's nn.matmul shape function ignores transpose_a there
                # (a fused matmul + relu over [3, 6] data returns [2, 2]), before and after any pass
                y = relay.nn.matmul(relay.transpose(data), w, transpose_a=True)
            elif br.transposed:
                y = relay.nn.matmul(data, w)
            else:
                y = relay.nn.dense(data, w)
            if br.out_root:
                outs.append(y)
            out, dtype = self.out_shape(family, br.width), spec.dtype
            for j, f in enumerate(br.followers):
                y, dtype = self.follower(f, y, dtype, family, out, i)
                if br.tap and j == 0:
                    outs.append(y)
            finals.append((y, dtype))
            outs.append(y)
        return outs


def build_module(spec: ModuleSpec, prefix: str = "") -> tvm.IRModule:
    """Graphs inline in ``main``, or each but the last its own global function that ``main`` calls.

    ``prefix`` names every function (``ref_main``...), so a reference copy can sit beside the
    optimized module in one build.
    """
    def rng(i: int) -> np.random.Generator:  # one stream per graph: dropping a graph keeps the others' data
        return np.random.default_rng([spec.seed, i])

    mod = tvm.IRModule()
    if not spec.calls:
        builders = [_GraphBuilder(g, rng(i), f"g{i}_") for i, g in enumerate(spec.graphs)]
        outs = [o for b in builders for o in b.emit()]
        mod[prefix + "main"] = relay.Function([p for b in builders for p in b.params], relay.Tuple(outs))
        return relay.transform.InferType()(mod)
    params, calls = [], []
    *called, last = spec.graphs if len(spec.graphs) > 1 else (*spec.graphs, None)
    for i, g in enumerate(called):
        b = _GraphBuilder(g, rng(i), f"g{i}_")
        body = relay.Tuple(b.emit())
        gv = relay.GlobalVar(f"{prefix}g{i}")
        mod[gv] = relay.Function(b.params, body)
        mod = relay.transform.InferType()(mod)  # callees typed before a caller (else inference fails on ?)
        own = [relay.var(f"main_{p.name_hint}", type_annotation=p.type_annotation) for p in b.params]
        params.extend(own)
        calls.append(relay.Call(gv, own))
    if last is not None:  # main has siblings of its own beside its calls
        b = _GraphBuilder(last, rng(len(called)), f"g{len(called)}_")
        calls.extend(b.emit())
        params.extend(b.params)
    mod[prefix + "main"] = relay.Function(params, relay.Tuple(calls))
    return relay.transform.InferType()(mod)


def random_inputs(mod: tvm.IRModule, seed: int) -> list[np.ndarray]:
    """Arrays for ``main``'s parameters; every ``?`` dim runs at ``M_ROWS``."""
    rng = np.random.default_rng(seed + 1)
    arrays = []
    for p in mod["main"].params:
        ty = p.type_annotation
        shape = tuple(int(d) if isinstance(d, tvm.tir.IntImm) else M_ROWS for d in ty.shape)
        arrays.append(random_array(shape, str(ty.dtype), rng))
    return arrays
