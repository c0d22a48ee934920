"""Run on n ranks by ``test_fuzz_collectives_world.py``: the Relax side of ``collective_world_harness``.

The drawn boolean puts each run of pure ops in a dataflow block (``build_collectives_relax``).
Usage: ``collective_world_prog.py OUT_DIR COUNT SEED``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from build_collectives_relax import build_module  # noqa: E402
from collective_spec import setting_passes  # noqa: E402
from collective_world_harness import WorldIR, rank_main  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_combiners.collectives.runtime  # noqa: E402, F401 - registers the runtime functions
from tvm_combiners.collectives import relax as CR  # noqa: E402
from tvm_combiners.collectives.relax import combiners as CB  # noqa: E402

TARGET = tvm.target.Target({"kind": "llvm", "opt-level": 0})  # tiny modules compile twice as fast


def run(mod: tvm.IRModule, _form: str, args: list[np.ndarray]) -> list[np.ndarray]:
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=CR.pipeline(TARGET))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    return [o.numpy() for o in out]


RELAX = WorldIR(
    forms=("plain", "dataflow"),
    build=lambda program, form, n: build_module(program, form == "dataflow", ranks=n),
    optimize=lambda name, mod: tvm.transform.Sequential(setting_passes(CB, name))(mod),
    run=run,
    text=lambda mod: mod.script(),
)

if __name__ == "__main__":
    rank_main(RELAX)
