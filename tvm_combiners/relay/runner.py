"""Build and run Relay modules, count ops: shared by the CLI, tests and benchmarks."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relay
from tvm.contrib import graph_executor

from ..host import host_cpu, rank_gpu

#: hhb-tvm's default "llvm" means riscv64: always name the host triple.
LLVM_TARGET = "llvm -mtriple=x86_64-linux-gnu"


def make_target(kind: str) -> tvm.target.Target:
    """``llvm`` for this CPU (x86-64 triple, host ``-mcpu``), or ``cuda`` with that llvm host."""
    host = f"{LLVM_TARGET} -mcpu={host_cpu()}"
    if kind == "llvm":
        return tvm.target.Target(host)
    if kind == "cuda":
        return tvm.target.Target("cuda", host=host)
    raise ValueError(f"unknown target {kind!r}: expected 'llvm' or 'cuda'")


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


def build(mod: tvm.IRModule, params: dict | None = None, target: str = "llvm") -> Any:
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=make_target(target), params=params)


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
    with tvm.transform.PassContext(opt_level=3):
        exe = relay.vm.compile(mod, target=make_target("llvm"), params=params)
    vm = tvm.runtime.vm.VirtualMachine(exe, tvm.cpu())
    out = vm.run(**inputs)
    items = out if isinstance(out, (list, tuple, tvm.runtime.container.ADT)) else [out]
    return [o.numpy() for o in items]


def run_interpreter(mod: tvm.IRModule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The debug executor: no build, fast for tiny test graphs."""
    out = relay.create_executor("debug", mod=mod, device=tvm.cpu(), target=make_target("llvm")).evaluate()(*inputs)
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
