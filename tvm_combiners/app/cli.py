"""``tvm-combiners``: the command-line main job.

Every failure ends in one line on stderr, ``tvm-combiners: error: <file>: <stage>: <what is
wrong>``, and a non-zero exit: 2 for a bad model or option, 1 for a bug of ours (the line then
says so); ``--debug`` adds the traceback. A command line argparse rejects is one line too
(``tvm-combiners: error: run: argument --batch: invalid int value: 'x'``, exit 2), not the usage
block. With ``--json`` (before any ``--``) stdout holds exactly one JSON document, the report or
``{"ok": false, "error": {...}}``; progress lines always go to stderr.

A subcommand's module is imported only when that subcommand runs (``run`` never imports MPI).
``launch --example NAME`` runs a packaged example (:mod:`tvm_combiners.app.examples`)
on the ranks. Its options are checked here before any rank starts (a bad one is one line, not a
traceback per rank); with ``--json`` rank 0 writes its report to a file the CLI then prints, and
whatever mpiexec or the ranks print goes to stderr, so stdout holds one document for the whole
job even when a rank dies first or the job times out (then the error document).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from .usage import PROG, Parser, UsageError, parse_input_shapes


def _setup_error(args: argparse.Namespace, line: str) -> int:
    """A bad option or command line: exit 2, ``bad_input``."""
    return _error(args, line, 2, {"file": None, "stage": "setup", "message": line, "bad_input": True})


@dataclass(frozen=True)
class Command:
    """A subcommand: its help line and a loader returning ``(add_arguments, main)``.

    The loader runs only for the subcommand being parsed, so its imports stay lazy.
    """

    help: str
    load: Callable[[], tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]]


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("model", nargs="?", help="ONNX file (default: paraphrase-MiniLM-L3-v2 from PyPI)")
    run.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
    run.add_argument("--ir", choices=["relax", "relay"], default=None,
                     help="IR to import into (default: relax where apache-tvm 0.27 is installed, else relay)")
    run.add_argument("--batch", type=int, default=1, help="size of the dynamic batch axes (default 1)")
    run.add_argument("--seq", type=int, default=128,
                     help="size of the other dynamic axes: sequence, image height and width (default 128)")
    run.add_argument("--input-shapes", default=None, metavar="SHAPES",
                     help="inputs' shapes by name, as tvmc takes them: 'input_ids:1x128,mask:1x128' or "
                          "'pixel_values:[1,3,224,224]'; --batch/--seq size the dynamic axes left")
    run.add_argument("--inputs", default=None, metavar="FILE.npz",
                     help="run on this data (numpy .npz, one array per model input, by name) instead of generated "
                          "inputs; its shapes size the inputs")
    run.add_argument("--repeat", type=int, default=5, help="timed runs per module (median reported)")
    run.add_argument("--no-combine", action="store_true", help="skip the combiner passes")
    run.add_argument("--combine-as", choices=["stack", "concat"], default="stack",
                     help="matmul branches of one width on one input become one batched matmul over stacked "
                          "weights (stack, the default, as the passes' to_batch=True) or one GEMM over "
                          "concatenated weights (concat); other groups always concatenate")
    run.add_argument("--tune", type=int, default=None, metavar="TRIALS",
                     help="tune every module with MetaSchedule, TRIALS per task (Relax); records are kept and reused")
    run.add_argument("--tune-dir", default=None, metavar="DIR",
                     help="where tuning records live (default: $TVM_COMBINERS_TUNE_DIR or ~/.cache/tvm_combiners/tune)")
    run.add_argument("--tune-tasks", choices=["all", "gemm"], default=None,
                     help="which tasks --tune tunes: all (the default), or gemm: GEMMs and convolutions only, the "
                          "rest keeping the default schedules (dlight on cuda, ours on llvm); a fraction of the tuning time")
    run.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of the table")
    run.add_argument("--debug", action="store_true", help="show the traceback of an error")




def _error(args: argparse.Namespace, line: str, code: int, detail: dict[str, Any],
           exc: BaseException | None = None) -> int:
    """Report a failure: the traceback under --debug, one line on stderr, the JSON error under --json."""
    if exc is not None and getattr(args, "debug", False):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": {**detail, "exit_code": code}}))
    return code


MAX_SIZE = 2**31 - 1


def _run(args: argparse.Namespace) -> int:
    from ..compile.tuning import MAX_TRIALS
    from .compare import json_safe
    from .job import JobError, run_job

    for name in ("batch", "seq", "repeat", "tune"):
        value = getattr(args, name)
        if value is not None and value < 1:
            return _setup_error(args, f"--{name} must be a positive integer, got {value}")
        # ONNX and TVM take 32-bit extents (a 20-digit --seq: ValueError); MetaSchedule counts all
        # trials in 32 bits (--tune 2147483647 on 2 tasks would wrap to 0 trials, reported as tuned)
        most = MAX_TRIALS if name == "tune" else MAX_SIZE
        if value is not None and value > most:
            return _setup_error(args, f"--{name} must be at most {most}, got {value}")
    if args.tune_dir is not None and (args.tune is None or not args.tune_dir):
        return _setup_error(args, "--tune-dir needs --tune" if args.tune is None else "--tune-dir must name a folder")
    if args.tune_tasks is not None and args.tune is None:
        return _setup_error(args, "--tune-tasks needs --tune")
    try:
        shapes = parse_input_shapes(args.input_shapes) if args.input_shapes is not None else None
    except UsageError as err:
        return _setup_error(args, str(err).removeprefix("argument "))
    try:
        report = run_job(args.model, args.target, args.ir, args.batch, args.seq, not args.no_combine, args.repeat,
                         tune=args.tune, tune_dir=args.tune_dir, stack=args.combine_as == "stack",
                         tune_tasks=args.tune_tasks or "all", input_shapes=shapes, inputs=args.inputs)
    except JobError as err:
        line = str(err)
        if not err.bad_input:
            line += " (a bug in tvm-combiners: rerun with --debug for the traceback)"
        return _error(args, line, err.exit_code, err.to_dict(), err)
    except KeyboardInterrupt:
        return _error(args, "interrupted", 130, {"file": args.model, "stage": "interrupted", "message": "interrupted",
                                                 "bad_input": False})
    except Exception as err:  # a bug outside every stage: still one line
        from ..errors import first_line

        line = f"internal error: {type(err).__name__}: {first_line(err)} (a bug in tvm-combiners: rerun with --debug)"
        return _error(args, line, 1, {"file": args.model, "stage": "internal", "message": line, "bad_input": False}, err)
    if args.json:
        print(json.dumps(json_safe(report.to_dict()), indent=2))
    else:
        print(report.render())
    return 0


def _load_launch() -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    from ..collectives.runtime import launcher
    from .examples import EXAMPLES

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        launcher.add_arguments(parser)
        parser.add_argument("--example", choices=list(EXAMPLES), default=None,
                            help="run a packaged example on the N ranks (options after '--' go to the example)")
        parser.add_argument("--json", action="store_true",
                            help="with --example: the job's report as one JSON document on stdout")

    def check(args: argparse.Namespace) -> None:
        launcher.resolve(args)
        launcher.check_job(args.np, args.timeout)
        launcher.find_mpiexec()

    return add_arguments, lambda args: _launch(args, launcher.main, check)


def _launch(args: argparse.Namespace, run_job: Callable[[argparse.Namespace], int],
            check_job: Callable[[argparse.Namespace], None] = lambda args: None) -> int:
    """``launch``: a command, or ``--example NAME`` whose rank 0 reports (as JSON with ``--json``)."""
    import tempfile

    from .examples import check_options, example_command

    extra = args.argv[1:] if args.argv[:1] == ["--"] else list(args.argv)
    if args.example is None:
        if args.json:
            return _setup_error(args, "launch: --json needs --example (a command's output is its own)")
        return run_job(args)
    if extra and not extra[0].startswith("-"):
        return _setup_error(args, f"launch: --example {args.example} runs the example itself: after '--' give only "
                                  f"its options (e.g. -- --help), not a command ({extra[0]!r})")
    if args.np is not None and args.np < 1:
        return _setup_error(args, f"launch: -n must be a positive number of ranks, got {args.np}")
    try:  # the launcher's own options too, before the job (its failure would read as the job's)
        check_job(args)
    except (ValueError, FileNotFoundError) as err:
        return _setup_error(args, "launch: " + str(err).removeprefix(f"{PROG} launch: "))
    try:  # here, once, before any rank starts: not a traceback (or a help text) from every rank
        help_text = check_options(args.example, extra, args.np)
    except UsageError as err:
        return _setup_error(args, f"launch --example {args.example}: {err}")
    if help_text is not None:
        print(help_text, end="", file=sys.stderr if args.json else sys.stdout)
        return 0
    with tempfile.TemporaryDirectory(prefix="tvm-combiners-example-") as folder:
        json_out = os.path.join(folder, "report.json") if args.json else None
        args.argv = example_command(args.example, extra, json_out)
        args.no_prefix = True  # rank 0 alone prints the example's report
        if json_out is None:
            return run_job(args)
        with _stdout_to_stderr():
            code = run_job(args)
        if not os.path.exists(json_out):
            ended = f"timed out after {args.timeout:g} s" if code == 124 else "ended"
            line = f"launch --example {args.example}: the job {ended} (exit code {code}) before rank 0 wrote its report"
            return _error(args, line, code or 1, {"file": None, "stage": "launch", "message": line, "bad_input": False})
        with open(json_out) as f:
            sys.stdout.write(f.read().rstrip("\n") + "\n")
        sys.stdout.flush()
    return code


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 is stderr's meanwhile: mpiexec and the ranks inherit it, so what they print
    (MPICH's BAD TERMINATION banner when a rank is killed or the job times out) stays out of the
    one JSON document that stdout holds under ``--json``."""
    if sys.stdout is None:  # started with stdout closed: nothing to keep clean
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


#: Subcommands by name. A new one (or new options of one) is an entry here and its module's
#: ``add_arguments(parser)`` / ``main(args) -> int``; nothing else in this file changes.
COMMANDS: dict[str, Command] = {
    "run": Command("import an ONNX model, combine parallel ops, compile, run and report",
                   lambda: (_add_run_arguments, _run)),
    "launch": Command("run a command (or --example dp-train|pipeline-bert|tp-bert) on N MPI ranks with a timeout "
                      "(python programs under mpi4py)", _load_launch),
}


def _parser(command: str | None) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` only (loading no other subcommand)."""
    parser = Parser(prog=PROG, description="Combine parallel ops of ONNX models in TVM (run); "
                                           "run multi-rank jobs (launch).")
    sub = parser.add_subparsers(dest="subcommand", metavar="{" + ",".join(COMMANDS) + "}", required=True)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        if name == command:
            try:
                add_arguments, main = cmd.load()
            except ImportError as err:
                raise _Unavailable(f"{name} is unavailable in this environment: {err}") from err
            add_arguments(p)
            p.set_defaults(func=main)
    return parser


class _Unavailable(Exception):
    """A subcommand whose module cannot be imported here."""


def _usage_error(err: UsageError, argv: list[str]) -> NoReturn:
    """One line (argparse's message, after the subcommand), the JSON error document where ``--json``
    comes before any ``--``, and exit 2 by SystemExit as argparse does."""
    before = argv[:argv.index("--")] if "--" in argv else argv
    where = err.prog.removeprefix(PROG).strip()
    _setup_error(argparse.Namespace(json="--json" in before), f"{where}: {err}" if where else str(err))
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    from ..startup import keep_torch_out_of_tvm_import

    keep_torch_out_of_tvm_import()  # ~3 s of a core where torch is installed, which nothing here uses
    argv = sys.argv[1:] if argv is None else list(argv)
    if sys.stderr is None:  # started with stderr closed (2>&-): print(file=None) would write into stdout's JSON
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        parser = _parser(command)
    except _Unavailable as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        _usage_error(err, argv)
    from ..compile.host import mcpu_problem

    try:  # before any work, once: a launch's ranks would each fail on it
        problem = mcpu_problem()
    except Exception:  # noqa: BLE001 - TVM itself fails to load: the command says so in its own words
        problem = None
    if problem is not None:
        return _setup_error(args, problem)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # stdout closed early (`| head`): no traceback, and none at exit either
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141  # 128 + SIGPIPE, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
