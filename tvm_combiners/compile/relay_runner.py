"""Build and run Relay modules, count ops: shared by the CLI, tests and benchmarks."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor

from ..relay.graph_view import EIGHT_BIT
from .host import cpu_features, llvm_options, rank_gpu

#: hhb-tvm's default "llvm" means riscv64: always name the host triple.
LLVM_TARGET = "llvm -mtriple=x86_64-linux-gnu"


#: x86 extensions TVM 0.16's strategies mishandle: with AMX its int8 dense and batch_matmul pick
#: AMX kernels, which die of SIGILL (nothing asks the kernel for AMX first) or fail to tensorize.
#: Without them the same ops take the VNNI kernels, which compute right.
LEAVE_OUT = ("amx-tile", "amx-int8", "amx-bf16")

#: Ops whose 8-bit operands TVM 0.16 on x86 multiplies with tensorized int8 dot products.
EIGHT_BIT_PRODUCTS = ("nn.dense", "nn.matmul", "nn.batch_matmul", "nn.conv2d")


def make_target(kind: str, cpu: str | None = None) -> tvm.target.Target:
    """``llvm`` for this CPU (or the LLVM CPU ``cpu`` names; x86-64 triple, :data:`LEAVE_OUT` off),
    or ``cuda`` with that llvm host."""
    options = llvm_options(cpu, LEAVE_OUT)
    host = f"{LLVM_TARGET} -mcpu={options['mcpu']}"
    if "mattr" in options:
        host += f" -mattr={','.join(options['mattr'])}"
    if kind == "llvm":
        return tvm.target.Target(host)
    if kind == "cuda":
        return tvm.target.Target("cuda", host=host)
    raise ValueError(f"unknown target {kind!r}: expected 'llvm' or 'cuda'")


def int8_dot_products_are_exact(target: tvm.target.Target) -> bool:
    """Whether TVM 0.16's x86 int8 kernels compute right for ``target``.

    They multiply with VNNI's ``vpdpbusd`` where the CPU has it; without it (AVX2, AVX-512 without
    VNNI) with ``vpmaddubsw``, whose 16-bit sums of two uint8 x int8 products saturate: measured
    wrong in 33-99% of the elements of dense, batch_matmul and conv2d on ``skylake-avx512``, and of
    conv2d on ``haswell`` and ``znver3``. Below SSE4.2 TVM takes its plain loops, which are right.
    """
    if target.kind.name != "llvm":
        return True
    mattr = tuple(str(a) for a in target.attrs.get("mattr", []))
    features = cpu_features(str(target.attrs.get("mcpu", "generic")), mattr)
    return "sse4.2" not in features or "avx512vnni" in features or "avxvnni" in features


@relay.transform.function_pass(opt_level=0, name="tvm_combiners.WidenEightBitProducts")
class WidenEightBitProducts:
    """8-bit operands of :data:`EIGHT_BIT_PRODUCTS` accumulating in int32 are cast to int32 first:
    the same sums, computed by TVM's int32 kernels instead of its int8 dot products."""

    def transform_function(self, func: relay.Function, _mod: tvm.IRModule, _ctx: Any) -> relay.Function:
        class Widen(relay.ExprMutator):
            def visit_call(self, call: relay.Call) -> relay.Expr:
                new = super().visit_call(call)
                if not (isinstance(call.op, tvm.ir.Op) and call.op.name in EIGHT_BIT_PRODUCTS
                        and str(call.attrs.out_dtype) == "int32"):
                    return new
                dtypes = [str(a.checked_type.dtype) for a in call.args]
                if not any(d in EIGHT_BIT for d in dtypes):
                    return new
                args = [relay.cast(a, "int32") if d in EIGHT_BIT else a for a, d in zip(new.args, dtypes)]
                return relay.Call(new.op, args, new.attrs, new.type_args, new.span)

        return Widen().visit(func)


def for_target(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` as it must be built for ``target``: where TVM's int8 kernels would saturate
    (:func:`int8_dot_products_are_exact`), QNN ops are lowered and 8-bit products widened."""
    if int8_dot_products_are_exact(target):
        return mod
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential([
            relay.transform.InferType(), relay.qnn.transform.Legalize(), relay.qnn.transform.CanonicalizeOps(),
            relay.transform.InferType(), WidenEightBitProducts(), relay.transform.InferType(),
        ])(mod)


def count_ops(mod: tvm.IRModule, names: Sequence[str] | None = None) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

    def visit(expr: Any) -> None:
        if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op):
            if names is None or expr.op.name in names:
                counts[expr.op.name] += 1

    for _, func in mod.functions.items():
        if isinstance(func, relay.Function):
            relay.analysis.post_order_visit(func, visit)
    return counts


def build(mod: tvm.IRModule, params: dict | None = None, target: str = "llvm", cpu: str | None = None) -> Any:
    """``relay.build`` at opt_level 3 for ``target`` (``cpu``: the LLVM CPU instead of this machine's)."""
    tvm_target = make_target(target, cpu)
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(for_target(mod, tvm_target), target=tvm_target, params=params)


def _graph_module(lib: Any, inputs: dict[str, np.ndarray], target: str) -> tuple[Any, Any]:
    dev = tvm.cpu() if target == "llvm" else tvm.cuda(rank_gpu())
    module = graph_executor.GraphModule(lib["default"](dev))
    for name, value in inputs.items():
        module.set_input(name, value)
    return module, dev


def run_graph(lib: Any, inputs: dict[str, np.ndarray], target: str = "llvm") -> list[np.ndarray]:
    module, _ = _graph_module(lib, inputs, target)
    module.run()
    return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]


def time_graph(lib: Any, inputs: dict[str, np.ndarray], target: str = "llvm", repeat: int = 5) -> float:
    """Median seconds per run of the graph executor (inputs set once)."""
    module, dev = _graph_module(lib, inputs, target)
    return float(np.median(module.module.time_evaluator("run", dev, number=1, repeat=repeat)().results))


def run_vm(mod: tvm.IRModule, params: dict | None, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Compile with the Relay VM and run once on the CPU."""
    target = make_target("llvm")
    with tvm.transform.PassContext(opt_level=3):
        exe = relay.vm.compile(for_target(mod, target), target=target, params=params)
    vm = tvm.runtime.vm.VirtualMachine(exe, tvm.cpu())
    out = vm.run(**inputs)
    items = out if isinstance(out, (list, tuple, tvm.runtime.container.ADT)) else [out]
    return [o.numpy() for o in items]


def run_interpreter(mod: tvm.IRModule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The debug executor: no build, fast for tiny test graphs."""
    target = make_target("llvm")
    out = relay.create_executor("debug", mod=for_target(mod, target), device=tvm.cpu(), target=target).evaluate()(*inputs)
    items = out if isinstance(out, (list, tuple, tvm.runtime.container.ADT)) else [out]
    return [o.numpy() for o in items]


def relays_own_passes(mod: tvm.IRModule) -> tvm.IRModule:
    """Relay's built-in combiners as a user would run them (after CSE, at opt_level 4)."""
    seq = tvm.transform.Sequential([
        relay.transform.EliminateCommonSubexpr(),
        relay.transform.CombineParallelDense(min_num_branches=2, to_batch=False),
        relay.transform.CombineParallelBatchMatmul(min_num_branches=2),
        relay.transform.CombineParallelConv2D(min_num_branches=2),
    ])
    with tvm.transform.PassContext(opt_level=4):
        return relay.transform.InferType()(seq(mod))
