"""Turn a :mod:`fuzz_spec` module spec into a Relax module and matching random inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from fuzz_spec import C_PIECE, IMAGE, K_PIECE, M_ROWS, Follower, GraphSpec, K, ModuleSpec, Side
from tvm import relax, tirx

R = relax.op

#: Relax op counted per family (to check a family's pass never touches another family's roots).
ROOT_OPS = {"matmul": "matmul", "batch_matmul": "matmul", "conv2d": "nn.conv2d"}
CAST_TO = {"float32": "float16", "float16": "float32", "int32": "float32"}
#: Roots over 8-bit operands accumulate in int32 (as quantized models do); followers then see int32.
WIDENED = {"int8": "int32"}
UNARY = {"relu": R.nn.relu, "sigmoid": R.sigmoid, "tanh": R.tanh, "gelu": R.nn.gelu, "silu": R.nn.silu,
         "negative": R.negative, "abs": R.abs, "square": R.square}
BINARY = {"add": R.add, "subtract": R.subtract, "multiply": R.multiply, "maximum": R.maximum,
          "minimum": R.minimum, "divide": R.divide}


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("int"):
        return rng.integers(-3, 4, shape).astype(dtype)
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


class _GraphBuilder:
    """Emits one graph into an open dataflow block; parameters are created on demand."""

    def __init__(self, bb: relax.BlockBuilder, spec: GraphSpec, rng: np.random.Generator, prefix: str) -> None:
        self.bb, self.spec, self.rng, self.prefix = bb, spec, rng, prefix
        self.params: list[relax.Var] = []
        self.m = tirx.Var(f"{prefix}m", "int64") if spec.symbolic else M_ROWS
        self.shared: dict[Any, relax.Expr] = {}  # pools, bases and shared side operands by key

    # leaves -------------------------------------------------------------------------------
    def param(self, shape: tuple, dtype: str) -> relax.Var:
        var = relax.Var(f"{self.prefix}p{len(self.params)}", relax.TensorType(shape, dtype))
        self.params.append(var)
        return var

    def leaf(self, shape: tuple, dtype: str, const: bool) -> relax.Expr:
        if const and all(isinstance(d, int) for d in shape):
            return relax.const(random_array(shape, dtype, self.rng), dtype)
        return self.param(shape, dtype)

    def once(self, key: Any, make: Any) -> relax.Expr:
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]

    # shapes -------------------------------------------------------------------------------
    def data_shape(self, family: str, width: int) -> tuple:
        if family == "matmul":
            return (self.spec.batch, self.m, width) if self.spec.rank3 else (self.m, width)
        if family == "batch_matmul":
            return (self.spec.batch, self.m, width)
        return (1, width, IMAGE, IMAGE) if self.spec.layout == "NCHW" else (1, IMAGE, IMAGE, width)

    def side_shape(self, family: str, kind: str, out_shape: tuple) -> tuple:
        if kind == "scalar":
            return ()
        if kind == "full":
            return tuple(out_shape)
        if family == "conv2d":
            nchw = self.spec.layout == "NCHW"
            c = out_shape[1] if nchw else out_shape[3]
            h, w = (out_shape[2], out_shape[3]) if nchw else (out_shape[1], out_shape[2])
            if kind == "channel":
                return (c, 1, 1) if nchw else (c,)
            return (1, 1, h, w) if nchw else (h, w, 1)
        if kind == "channel":
            return (out_shape[-1],)
        return (*out_shape[:-1], 1)

    # sources ------------------------------------------------------------------------------
    def source(self, index: int) -> relax.Expr:
        return self.once(("source", index), lambda: self._make_source(index))

    def _make_source(self, index: int) -> relax.Expr:
        src, bb, dtype = self.spec.sources[index], self.bb, self.spec.dtype
        channels = K if src.family != "conv2d" else 3 * C_PIECE
        if src.kind == "param":
            return self.param(self.data_shape(src.family, channels), dtype)
        if src.kind == "copy":
            base = self.source(src.of)
            return bb.emit(R.reshape(base, base.ty.shape))
        if src.kind == "concat":
            piece = K_PIECE if src.family != "conv2d" else C_PIECE
            pool = [self.once(("pool", src.family, i), lambda: self.param(self.data_shape(src.family, piece), dtype))
                    for i in range(3)]
            axis = 1 if src.family == "conv2d" and self.spec.layout == "NCHW" else -1
            return bb.emit(R.concat([pool[i] for i in src.picks], axis=axis))
        vectors = [self.once(("vector", i), lambda: self.param((K,), dtype)) for i in range(3)]
        a, g, b = (vectors[i] for i in src.picks)
        normed = bb.emit(R.nn.layer_norm(a, g, b, axes=[-1]))
        base = self.once(("base", src.family), lambda: self.param(self.data_shape(src.family, K), dtype))
        return bb.emit(R.add(base, normed))

    # branches -----------------------------------------------------------------------------
    def side(self, family: str, side: Side, out_shape: tuple, dtype: str, branch: int) -> relax.Expr:
        if side.shape == "prim":  # per branch, a value of its own unless shared
            value = 2 + (0 if side.shared else branch)
            imm = tvm.tirx.FloatImm(dtype, value / 2) if dtype.startswith("float") else tvm.tirx.IntImm(dtype, value)
            return relax.prim_value(imm)
        shape = self.side_shape(family, side.shape, out_shape)
        key = ("side", side.shape, side.const, tuple(str(d) for d in shape), dtype)
        if not side.shared:
            key = (*key, branch)
        return self.once(key, lambda: self.leaf(shape, dtype, side.const))

    def follower(self, f: Follower, y: relax.Expr, family: str, branch: int) -> relax.Expr:
        bb = self.bb
        dtype = str(y.ty.dtype)
        shape = tuple(y.ty.shape.values)
        if f.op in UNARY:
            return bb.emit(UNARY[f.op](y))
        if f.op == "clip":
            return bb.emit(R.clip(y, -1, 1))
        if f.op == "cast":
            return bb.emit(R.astype(y, CAST_TO[dtype]))
        if f.op == "reshape":
            return bb.emit(R.reshape(y, y.ty.shape))
        if f.op == "where":
            cond = self.side(family, f.side, shape, "bool", branch)
            other = relax.const(np.array(0.5 if dtype.startswith("float") else 1, dtype), dtype)
            args = (other, y) if f.side.left else (y, other)
            return bb.emit(R.where(cond, *args))
        if f.op == "bias_add":
            f = Follower("add", f.side)
        side = self.side(family, f.side, shape, dtype, branch)
        return bb.emit(BINARY[f.op](side, y) if f.side.left else BINARY[f.op](y, side))

    def weight(self, family: str, width: int, kernel: int, kind: str, transposed: bool) -> relax.Expr:
        dtype = self.spec.dtype
        if family == "conv2d":
            c = 3 * C_PIECE
            shape = (width, c, kernel, kernel) if self.spec.layout == "NCHW" else (kernel, kernel, c, width)
            return self.leaf(shape, dtype, kind == "const")
        lead = (self.spec.batch,) if family == "batch_matmul" else ()
        if not transposed:
            return self.leaf((*lead, K, width), dtype, kind == "const")
        w = self.leaf((*lead, width, K), dtype, kind == "const")
        axes = [0, 2, 1] if lead else [1, 0]
        return self.bb.emit(R.permute_dims(w, axes))

    def emit(self) -> list[relax.Expr]:
        bb, spec = self.bb, self.spec
        outs: list[relax.Expr] = []
        finals: list[relax.Expr] = []
        for i, br in enumerate(spec.branches):
            family = spec.sources[br.source].family
            data = self.source(br.source)
            w = self.weight(family, br.width, br.kernel, br.weight, br.transposed)
            if br.dep is not None:
                shift = bb.emit(R.max(finals[br.dep]))
                if spec.dtype == "int8":  # int8 weights stay far from overflow
                    shift = bb.emit(R.clip(shift, -3, 3))
                w = bb.emit(R.add(w, bb.emit(R.astype(shift, spec.dtype))))
            out_dtype = WIDENED.get(spec.dtype)
            if family == "conv2d":
                kernel_layout = "OIHW" if spec.layout == "NCHW" else "HWIO"
                y = bb.emit(R.nn.conv2d(data, w, strides=spec.stride, padding=br.kernel // 2,
                                        data_layout=spec.layout, kernel_layout=kernel_layout, out_dtype=out_dtype))
            else:
                y = bb.emit(R.matmul(data, w, out_dtype=out_dtype))
            if br.out_root:
                outs.append(y)
            for j, f in enumerate(br.followers):
                y = self.follower(f, y, family, i)
                if br.tap and j == 0:
                    outs.append(y)
            finals.append(y)
            outs.append(y)
        return outs


def _function(bb: relax.BlockBuilder, builders: list[_GraphBuilder], name: str) -> relax.Function:
    """Emit the graphs, then give the function the parameters they created on the way."""
    with bb.function(name, []):
        with bb.dataflow():
            outs = [o for b in builders for o in b.emit()]
            gv = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(gv)
    func = bb.get()[name]
    params = [p for b in builders for p in b.params]
    return relax.Function(params, func.body, func.ret_ty, True, func.attrs)


def build_module(spec: ModuleSpec) -> tvm.IRModule:
    """Graphs inline in ``main``'s one dataflow block, or each but the last its own function that ``main`` calls."""
    def rng(i: int) -> np.random.Generator:  # one stream per graph: dropping a graph keeps the others' data
        return np.random.default_rng([spec.seed, i])

    if not spec.calls:
        bb = relax.BlockBuilder()
        builders = [_GraphBuilder(bb, g, rng(i), f"g{i}_") for i, g in enumerate(spec.graphs)]
        return relax.transform.Normalize()(tvm.IRModule({"main": _function(bb, builders, "main")}))
    funcs = {}
    *called, last = spec.graphs if len(spec.graphs) > 1 else (*spec.graphs, None)
    for i, g in enumerate(called):
        bb = relax.BlockBuilder()
        funcs[f"g{i}"] = _function(bb, [_GraphBuilder(bb, g, rng(i), f"g{i}_")], f"g{i}")
    bb = relax.BlockBuilder()
    params, calls = [], []
    for i, func in enumerate(funcs.values()):
        gv = bb.add_func(func, f"g{i}")
        rename: dict[Any, Any] = {}
        own = []
        for p in func.params:
            shape = []
            for d in p.ty.shape.values:
                if isinstance(d, tirx.IntImm):
                    shape.append(int(d))
                else:
                    shape.append(rename.setdefault(d, tirx.Var(f"main_{d.name}", "int64")))
            own.append(relax.Var(f"main_{p.name}", relax.TensorType(shape, str(p.ty.dtype))))
        params.extend(own)
        calls.append((gv, own))
    inline = [_GraphBuilder(bb, last, rng(len(called)), f"g{len(called)}_")] if last is not None else []
    with bb.function("main", []):
        with bb.dataflow():
            results = [bb.emit(relax.Call(gv, own)) for gv, own in calls]
            results += [o for b in inline for o in b.emit()]  # main has siblings of its own beside its calls
            out = bb.emit_output(relax.Tuple(results))
        bb.emit_func_output(out)
    mod = bb.get()
    main_gv = mod.get_global_var("main")
    main = mod[main_gv]
    params += [p for b in inline for p in b.params]
    mod[main_gv] = relax.Function(params, main.body, main.ret_ty, True, main.attrs)
    return mod


def random_inputs(mod: tvm.IRModule, seed: int) -> list[np.ndarray]:
    """Arrays for ``main``'s parameters; every symbolic dim runs at ``M_ROWS``."""
    rng = np.random.default_rng(seed + 1)
    return [random_array(tuple(int(d) if isinstance(d, tirx.IntImm) else M_ROWS for d in p.ty.shape.values),
                         str(p.ty.dtype), rng) for p in mod["main"].params]
