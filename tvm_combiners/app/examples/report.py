"""What both examples share: MPI helpers that do not burn cores, shared compilation, the report.

MPICH busy-polls while a rank waits in a collective, so ranks that wait for another rank's
compile (seconds) wait in a non-blocking barrier polled with sleeps instead. Compiling is spread
over the ranks (variant i on rank i mod N), each compiled module is exported to a folder every rank
sees, and every rank loads all of them: the job compiles each variant once, not once per rank.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...compile.host import usable_cores
from ..compare import json_safe


def comm() -> Any:
    from ...collectives.runtime.comm import mpi

    return mpi().COMM_WORLD


def quiet_barrier(poll_s: float = 0.02) -> None:
    """A barrier that sleeps while it waits (a blocking MPI barrier would spin a core)."""
    req = comm().Ibarrier()
    while not req.Test():
        time.sleep(poll_s)


def progress(tag: str, text: str) -> None:
    """A progress line on stderr (rank 0 only: the launcher prefixes it with the rank)."""
    if comm().Get_rank() == 0:
        print(f"[{tag}] {text}", file=sys.stderr, flush=True)


def compile_shared(builders: dict[str, Callable[[], Any]], tag: str) -> tuple[dict[str, Any], dict[str, float]]:
    """Compile each named module once in the whole job and load all of them on every rank.

    ``builders[name]()`` returns an executable (``tvm.compile``'s result); the variant with index i
    is built on rank i mod N and exported as a shared library. Returns (name -> loaded module,
    name -> compile seconds).
    """
    import tvm

    c = comm()
    rank, n = c.Get_rank(), c.Get_size()
    folder = c.bcast(tempfile.mkdtemp(prefix="tvm-combiners-example-") if rank == 0 else None, root=0)
    times: dict[str, float] = {}
    error = None
    try:
        for i, (name, build) in enumerate(builders.items()):
            if i % n == rank:
                start = time.perf_counter()
                build().export_library(os.path.join(folder, f"{name}.so"))
                times[name] = time.perf_counter() - start
                print(f"[{tag}] rank {rank} compiled {name} in {times[name]:.1f} s", file=sys.stderr, flush=True)
    except Exception as err:  # noqa: BLE001 - reported after the barrier so nobody waits forever
        error = err
    quiet_barrier()
    failed = [r for r, bad in enumerate(c.allgather(error is not None)) if bad]
    if failed:  # the folder goes before anyone raises: a raising rank aborts the whole job
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        quiet_barrier()
        if error is not None:
            raise error
        # the failing rank raises its own error; the others say where it happened
        raise RuntimeError(f"{tag}: compiling failed on rank {failed[0]} (its error is reported above)")
    all_times: dict[str, float] = {}
    for part in c.allgather(times):
        all_times.update(part)
    loaded = {name: tvm.runtime.load_module(os.path.join(folder, f"{name}.so")) for name in builders}
    quiet_barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return loaded, all_times


def oversubscription(ranks: int) -> str | None:
    """The report's line where the ranks outnumber the cores (their timings then include waiting for one)."""
    n = usable_cores()
    return f"{ranks} ranks on {n} cores: timings include oversubscription" if ranks > n else None


def times_in_turn(call: Callable[[], Any], repeat: int) -> float:
    """Median seconds of this rank's ``call``, the ranks taking turns while the others sleep.

    Timed on every rank at once, N ranks on fewer cores would time their contention (a pipeline
    stage takes 231 ms among 3 ranks on 2 cores, 125 ms alone); the waiting ranks sleep in
    :func:`quiet_barrier`, where a blocking barrier would spin a core. One untimed call first.
    """
    c = comm()
    times: list[float] = []
    for turn in range(c.Get_size()):
        quiet_barrier()
        if turn == c.Get_rank():
            call()
            for _ in range(repeat):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
    quiet_barrier()
    return float(np.median(times))










def finish(report: dict[str, Any], render: Callable[[dict[str, Any]], str], as_json: bool,
           json_out: str | None = None) -> int:
    """Rank 0 prints the job's report (one JSON document, or text); every rank returns the exit code.

    ``report["ok"]`` decides the code (1 when an equality failed), agreed on by all ranks.
    ``json_out``: write the JSON document to that file instead (``tvm-combiners launch --json``
    prints it, or an error document when the job ended before writing it).
    """
    c = comm()
    ok = bool(c.bcast(report.get("ok", False) if c.Get_rank() == 0 else None, root=0))
    if c.Get_rank() == 0:
        if json_out:
            with open(json_out, "w") as f:
                json.dump(json_safe(report), f, indent=2)
        elif as_json:
            print(json.dumps(json_safe(report), indent=2), flush=True)
        else:
            print(render(report), flush=True)
        if not ok:
            print(f"[{report.get('example', 'example')}] FAILED: " + "; ".join(report.get("failures", [])),
                  file=sys.stderr, flush=True)
    return 0 if ok else 1


def example_main(parser: Any, config: Callable[[Any, int], Any], run: Callable[[Any], dict[str, Any]],
                 render: Callable[[dict[str, Any]], str], argv: list[str] | None) -> int:
    """An example's ``main`` on every rank: options checked (a bad one is one line, from rank 0, and
    exit 2 on every rank), the job run, rank 0 reporting (see :func:`finish`)."""
    from ...startup import keep_torch_out_of_tvm_import

    keep_torch_out_of_tvm_import()  # every rank imports TVM next: ~3 s of a core each where torch is installed
    from ...collectives.runtime import world_size
    from ..usage import UsageError

    try:
        args = parser.parse_args(argv)
        cfg = config(args, world_size())
        problem = args.json_out and _unwritable(args.json_out)
        if problem:
            raise UsageError(f"--json-out {args.json_out}: {problem}")
    except UsageError as err:
        if comm().Get_rank() == 0:
            print(f"{parser.prog}: error: {err}", file=sys.stderr, flush=True)
        return 2
    return finish(run(cfg), render, args.json, args.json_out)


def _unwritable(path: str) -> str | None:
    """Why rank 0 could not write the report to ``path`` (None when it could): checked before the
    job runs, which would otherwise end in a traceback after all its work, the report lost."""
    target = Path(path)
    if target.is_dir() or path.endswith(("/", os.sep)):
        return "is a folder"
    if not target.parent.is_dir():
        return f"no folder {target.parent}"
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        return "cannot be written"
    return None


def add_output_options(parser: Any) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document on rank 0's stdout")
    parser.add_argument("--json-out", default=None, metavar="FILE", help="write the JSON document to FILE (rank 0)")


def add_build_options(parser: Any, repeat: int, opt_level: int, repeat_help: str = "timed runs (median)") -> None:
    """The options every example shares: timed runs, LLVM's optimization level."""
    parser.add_argument("--repeat", type=int, default=repeat, help=repeat_help)
    parser.add_argument("--opt-level", type=int, choices=range(4), default=opt_level,
                        help="LLVM optimization level (0 compiles much faster)")


def note_lines(variants: dict[str, dict[str, Any]]) -> list[str]:
    """Each program's notes, once each with their count."""
    from collections import Counter

    return [f"{name}: {note}" + (f" (x{count})" if count > 1 else "")
            for name, v in variants.items() for note, count in Counter(v["notes"]).items()]


def verdict_line(report: dict[str, Any]) -> str:
    """The report's last line: OK, or FAILED with every failure."""
    return "OK: every check holds" if report["ok"] else "FAILED: " + "; ".join(report["failures"])


def interleaved_times(calls: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median seconds of each call, every rank starting together (a barrier before each call).

    The programs take turns (round r runs them in order, the next round in reverse), so a
    machine that gets busier or quieter during the run favours none of them.
    """
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeat):
        for name in names if r % 2 == 0 else reversed(names):
            comm().Barrier()  # short: every rank is here within milliseconds
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}
