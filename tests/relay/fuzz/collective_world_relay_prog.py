"""Run on n ranks by ``test_relay_fuzz_collectives_world.py``: the Relay side of ``collective_world_harness``.

The drawn boolean picks let form (the Relay VM) or graph form (the graph executor); channels are in
program order (``build_collectives_relay``, ``order="program"``), so the module means what the
program does. A module runs after OrderSendRecv (as the combiners see its channels); its outputs
may end with the joint token of unread sends.
Usage: ``collective_world_relay_prog.py OUT_DIR COUNT SEED``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "fuzz")]  # this builder; the IR-neutral specs

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from build_collectives_relay import build_module  # noqa: E402
from collective_spec import setting_passes  # noqa: E402
from collective_world_harness import WorldIR, rank_main  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib import graph_executor  # noqa: E402

import tvm_combiners.collectives.runtime  # noqa: E402, F401 - registers the runtime functions
from tvm_combiners.collectives import relay as C  # noqa: E402
from tvm_combiners.collectives.relay import combiners as CB  # noqa: E402

#: hhb-tvm's bare "llvm" is riscv64. LLVM at -O0 (as on the Relax side): tiny modules build 2-3x
#: faster with the same IEEE results; Relay's own passes (fusing the combiners' packing) stay at 3.
TARGET = tvm.target.Target("llvm -mtriple=x86_64-linux-gnu -opt-level=0")


def run(mod: tvm.IRModule, form: str, args: list[np.ndarray]) -> list[np.ndarray]:
    ordered = C.OrderSendRecv()(mod)
    with tvm.transform.PassContext(opt_level=3):
        if form == "let":
            exe = relay.vm.compile(ordered, target=TARGET)
            out = tvm.runtime.vm.VirtualMachine(exe, tvm.cpu()).invoke("main", *[tvm.nd.array(a) for a in args])
            return [o.numpy() for o in out]
        lib = relay.build(ordered, target=TARGET)
    g = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    for i, a in enumerate(args):
        g.set_input(f"x{i}", a)
    g.run()
    return [g.get_output(i).numpy() for i in range(g.get_num_outputs())]


RELAY = WorldIR(
    forms=("graph", "let"),
    build=lambda program, form, n: build_module(program, form, "program", ranks=n),
    optimize=lambda name, mod: tvm.transform.Sequential(setting_passes(CB, name))(mod),
    run=run,
    text=lambda mod: mod.astext(show_meta_data=True),
    extra_outputs=1,
)

if __name__ == "__main__":
    rank_main(RELAY)
