"""dp-train's step on 2 ranks: both on this host, and (``--nodes 2``) one on each of 2 simulated hosts.

    .venv/bin/python benchmarks/bench_dp_train.py [--quick] [--nodes 2 [--rate 1gbit] [--delay 250us]] [-- ...]

Runs ``tvm-combiners launch --example dp-train --json`` (:mod:`tvm_combiners.app.examples.dp_train`)
on 2 ranks of this host (MPI through shared memory), then, with ``--nodes 2``, the same job with one
rank on each of two simulated hosts (``tvm_combiners.collectives.testing``: network namespaces with
hostnames of their own, MPI over TCP between them, ``--rate``: each host's egress limited by ``tbf``,
``--delay``: the link's one-way latency),
launched as across machines (``launch --hosts node0:1,node1:1 --launcher-exec``). One table: for every
setting and program (``naive``: one allreduce per gradient; ``bucketed``: ``AllReduceCombiner``;
``bucketed+parallel-ops``: Q/K/V merged too) its allreduces, the median step and the median time of
the gradients' allreduces alone (the example's own timings, the slower rank's), and whether every
equality of the example held. Options after ``--`` go to the example (e.g. ``-- --threshold-bytes 262144``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from tvm_combiners.app.text_table import table
from tvm_combiners.collectives.testing.cluster import (
    ClusterUnavailable,
    SimulatedCluster,
    add_cluster_options,
    cluster_options_error,
    unavailable_reason,
)

QUICK = ["--layers", "1", "--steps", "2", "--repeat", "3", "--opt-level", "0"]  # a smoke run: compiles in seconds
TIMEOUT_S = 900


def _launch(hosts_argv: list[str], example: list[str], timeout: float) -> list[str]:
    return [sys.executable, "-m", "tvm_combiners.app.cli", "launch", *hosts_argv, "--timeout", f"{timeout:g}",
            "--example", "dp-train", "--json", "--", *example]


def _report(argv: list[str], where: str, timeout: float) -> dict:
    """The example's JSON report from the job ``argv`` (its checks failed or not); SystemExit naming ``where``
    if the job wrote none."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 120)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"dp-train {where}: exit code {proc.returncode}, no report\n{proc.stderr[-3000:]}") from None


def rows(where: str, report: dict) -> list[list[str]]:
    return [[where, name, str(v["allreduces"]), str(v["allreduce_bytes_total"]), f"{1e3 * v['step_s']:.1f}",
             f"{1e3 * v['allreduces_s']:.2f}", "ok" if report["ok"] else "FAILED"]
            for name, v in report["variants"].items()]


def render(results: list[tuple[str, dict]]) -> str:
    head = ["ranks", "program", "allreduces", "bytes", "step ms", "allreduces ms", "checks"]
    body = [row for where, report in results for row in rows(where, report)]
    cfg = results[0][1]["config"]
    return (f"dp-train, 2 ranks: {cfg['layers']} layers, hidden {cfg['hidden']}, seq {cfg['seq']}, "
            f"{cfg['batch_per_rank']} rows per rank, opt-level {cfg['opt_level']}; medians of {cfg['repeat']} steps "
            "(allreduces: of 4x as many), the slower rank's\n" + table(body, head))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small, fast-compiling model (a smoke run)")
    add_cluster_options(parser)
    parser.add_argument("example", nargs=argparse.REMAINDER, help="after '--': options for the dp-train example")
    args = parser.parse_args(argv)
    example = (QUICK if args.quick else []) + (args.example[1:] if args.example[:1] == ["--"] else args.example)
    if (error := cluster_options_error(args.nodes, args.rate, args.delay)) is not None:
        parser.error(error)  # before the on-host run
    if args.nodes is not None and (reason := unavailable_reason()) is not None:
        parser.error(reason)
    results = [("2 on one host", _report(_launch(["-n", "2"], example, TIMEOUT_S), "on one host", TIMEOUT_S))]
    if args.nodes is not None:
        where = f"1 + 1 on 2 hosts{', tbf ' + args.rate if args.rate else ''}{', ' + args.delay if args.delay else ''}"
        try:
            with SimulatedCluster(2, args.rate, args.delay) as cluster:
                job = cluster.on_node(0, _launch(["--hosts", cluster.hosts(1), "--launcher-exec", cluster.launcher],
                                                 example, TIMEOUT_S))
                results.append((where, _report(job, "across 2 simulated hosts", TIMEOUT_S)))
        except (ClusterUnavailable, ValueError) as err:
            raise SystemExit(str(err)) from None
    print(render(results))
    for where, report in results:
        for failure in report["failures"]:
            print(f"{where}: FAILED: {failure}")
    return 0 if all(report["ok"] for _, report in results) else 1


if __name__ == "__main__":
    sys.exit(main())
