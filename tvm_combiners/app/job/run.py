"""The main job: import an ONNX model, combine, compile, run, compare with onnxruntime, report."""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TextIO

import numpy as np

from .host import on_start_cores
from .interrupts import keep_interrupts
from .models import (
    ModelError,
    default_model_path,
    example_inputs,
    load_onnx,
    prepare_onnx,
    run_onnxruntime,
    time_onnxruntime,
)
from .models.loader import cpu_threads, first_line
from .text_table import table

COUNTED_OPS = ("matmul", "dense", "batch_matmul", "conv2d")
#: The IRs a job can use, in order of preference.
IRS = ("relax", "relay")


class Backend(Protocol):
    """What the job needs from an IR (Relax or Relay)."""

    name: str

    def import_model(self, model: Any) -> Any: ...
    def combine(self, mod: Any, on_combine: Any, to_batch: bool) -> Any: ...
    def count_ops(self, mod: Any) -> dict[str, int]: ...
    def target_problem(self, target: str) -> str | None:
        """Why this build cannot compile for ``target`` (None when it can): checked before any work."""
    def compile(self, mod: Any, target: str) -> Any: ...
    def run(self, built: Any, inputs: dict[str, np.ndarray], target: str) -> list[np.ndarray]: ...
    def time(self, built: Any, inputs: dict[str, np.ndarray], target: str, repeat: int) -> float:
        """Median seconds per run, inputs already on the device (TVM's time evaluator)."""
    def has_gpu(self) -> bool: ...
    def tune_problem(self, target: str, root: str | None) -> str | None:
        """Why ``--tune`` cannot run here (or keep its records under ``root``), or None."""
    def tune(self, mod: Any, target: str, trials: int, root: str | None, say: Any, tasks: str) -> tuple[Any, Any]:
        """Tune ``tasks`` ("all", or "gemm": GEMMs and convolutions only) of ``mod``: (database, summary)."""
    def compile_tuned(self, mod: Any, target: str, database: Any) -> Any: ...


@dataclass
class Variant:
    label: str
    ops: dict[str, int]
    compile_s: float
    latency_s: float | None = None
    max_abs_diff: float | None = None
    # tasks, tuned (in this run), trials_per_task, seconds, database, most_trials, selected (--tune-tasks gemm),
    # defaults_kept
    tuning: dict[str, Any] | None = None


#: The most trials per task ``--tune`` takes: MetaSchedule counts the trials of all tasks in 32 bits.
MAX_TRIALS = 100_000
#: What ``--tune-tasks`` may choose: every task, or only the GEMMs and convolutions.
TUNE_TASKS = ("all", "gemm")


def input_shapes(inputs: Mapping[str, Sequence[int]]) -> str:
    """``ids (1, 128), mask (1, 128)``: the inputs a run was given, by name."""
    return ", ".join(f"{name} {tuple(shape)}" for name, shape in inputs.items())


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """A distribution-free interval of about 95% for the median of ``values``: the k-th smallest to
    the k-th largest, k from the sign test (all of them up to 5 values, the 2nd to 9th of 10, the
    6th to 15th of 20), so that it narrows as rounds are added."""
    ordered, n = sorted(values), len(values)

    def below(k: int) -> float:  # P(at most k of n fair coin flips come up heads)
        return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n

    k = 1
    while k < n // 2 and 2 * below(k) <= 0.06:
        k += 1
    return ordered[k - 1], ordered[n - k]


@dataclass
class JobReport:
    model: str
    ir: str
    target: str
    batch: int
    seq: int
    variants: list[Variant] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    executed: bool = True
    note: str = ""
    ort_latency_s: float | None = None  # onnxruntime on the CPU, same inputs, TVM's thread count
    ort_threads: int | None = None
    round_speedups: list[float] = field(default_factory=list)  # baseline/combined, one per alternating round
    combine_as: str = "stack"  # how equal-width matmul branches combine: "stack" or "concat"
    inputs: dict[str, list[int]] = field(default_factory=dict)  # the shapes the modules ran on
    #: Under ``--tune``: the untuned baseline (the default schedules: dlight on cuda, ours on llvm), built for the
    #: tuned modules' check and timed too, so the report says whether tuning paid at this budget.
    untuned: Variant | None = None

    def sizes(self) -> str:
        """``batch B  seq S``; the input shapes instead where the model fixed a size that --batch/--seq asked otherwise."""
        shapes = list(self.inputs.values())
        # a size applied wherever it stands (a named dim may put the batch on axis 1, --seq sets an
        # image's height and width): it does not apply only where no input has it at all
        unused = [f"--{name} {size}" for name, size in (("batch", self.batch), ("seq", self.seq))
                  if shapes and not any(size in shape for shape in shapes)]
        if not unused:
            return f"batch {self.batch}  seq {self.seq}"
        listed = input_shapes(self.inputs)
        verb, them = ("do not apply", "them") if len(unused) > 1 else ("does not apply", "it")
        # fixed sizes, or no such axis at all ([n, 16] has no sequence): "the model fixes" was wrong there
        return f"inputs {listed} ({' and '.join(unused)} {verb}: no input axis of the model takes {them})"

    def table(self) -> str:
        ops = sorted({k for v in self.variants for k, n in v.ops.items() if n} or {"matmul"})
        head = ["module"] + [f"#{k}" for k in ops] + ["compile s", "latency ms", "max |diff| vs ORT"]
        rows = []
        for v in self.variants:
            rows.append(
                [v.label] + [str(v.ops.get(k, 0)) for k in ops] + [f"{v.compile_s:.2f}"]
                + ["-" if v.latency_s is None else f"{v.latency_s * 1e3:.2f}"]
                + ["-" if v.max_abs_diff is None else f"{v.max_abs_diff:.2e}"]
            )
        if self.untuned is not None:
            u = self.untuned
            rows.append(["baseline untuned"] + [str(u.ops.get(k, 0)) for k in ops] + [f"{u.compile_s:.2f}"]
                        + ["-" if u.latency_s is None else f"{u.latency_s * 1e3:.2f}"]
                        + ["-" if u.max_abs_diff is None else f"{u.max_abs_diff:.2e}"])
        if self.ort_latency_s is not None:
            rows.append([f"onnxruntime (cpu, {self.ort_threads} thread{'s' * (self.ort_threads != 1)})"] + ["-"] * len(ops) + ["-"]
                        + [f"{self.ort_latency_s * 1e3:.2f}", "0"])
        lines = table(rows, head).splitlines()
        ratio = self.speedup()
        if ratio is not None:
            lines.append(f"speedup of combined over baseline: {self.speedup_text(ratio)}")
        tuned = [v for v in self.variants if v.tuning]
        if tuned:
            # a budget: a task with fewer distinct schedules than that is measured fewer times
            trials = tuned[0].tuning["trials_per_task"]

            def reused(t: dict[str, Any]) -> str:  # records of a bigger budget, from an earlier run: say so
                most = t.get("most_trials", trials)
                return f", some reuse records of up to {most} trials" if most > trials else ""

            def chosen(t: dict[str, Any]) -> str:  # --tune-tasks gemm
                return "" if t.get("selected") is None else f"{t['selected']} GEMM or convolution tasks of them, "

            def kept(t: dict[str, Any]) -> str:  # searches that did not beat the untuned build's schedule
                return f", {t['defaults_kept']} kept their default schedule" if t.get("defaults_kept") else ""

            lines.append(f"tuned with MetaSchedule, up to {trials} trials per task: " + ", ".join(
                f"{v.label} {v.tuning['tasks']} tasks ({chosen(v.tuning)}{v.tuning['tuned']} tuned now{kept(v.tuning)}, "
                f"{v.tuning['seconds']:.0f} s{reused(v.tuning)})" for v in tuned)
                + f"; records in {tuned[0].tuning['database']}")
            paid = self.tuning_gain()
            if paid is not None:
                defaults = f"the default schedules ({'dlight' if self.target == 'cuda' else 'cpu_schedules'})"
                base = self.variants[0].tuning or {}
                same = base.get("tuned") and base["tuned"] == base.get("defaults_kept") == (
                    base.get("selected") or base.get("tasks"))  # every task it compiles with a record is on its default
                lines.append(f"tuning made the baseline {paid:.2f}x as fast as untuned" + (
                    "" if paid >= 1 else
                    f": no task's search beat {defaults}, so both builds run the same schedules (the difference is "
                    f"timing noise); tune with more trials" if same else
                    f": {trials} trials per task do not beat {defaults} here; deploy untuned, or tune with more trials"))
        timed = [v for v in self.variants if v.latency_s]
        if self.ort_latency_s and timed:
            lines.append("latency over onnxruntime's: " + ", ".join(f"{v.label} {v.latency_s / self.ort_latency_s:.2f}x"
                                                                 for v in timed))
        return "\n".join(lines)

    def speedup_measurable(self) -> bool:
        """Something was combined and the median ratio's interval (:func:`median_interval`) excludes 1."""
        rounds = self.round_speedups
        if not self.groups or len(rounds) < 2:
            return False
        low, high = median_interval(rounds)
        return not low <= 1.0 <= high

    def speedup_text(self, ratio: float) -> str:
        """The speed-up as the rounds support it: none where nothing was combined, no measurable
        difference where the median's interval holds 1 (the range shown: that interval, every
        round's ratio up to 5 rounds)."""
        rounds = self.round_speedups
        spread = "{:.2f}x-{:.2f}x".format(*median_interval(rounds)) if len(rounds) > 1 else ""
        if not self.groups:
            return (f"none, nothing was combined (the modules are the same; their rounds' ratios, {spread}, are "
                    "the timing noise)" if spread else "none, nothing was combined (the modules are the same)")
        if not spread:
            return f"{ratio:.2f}x (one round)"
        if not self.speedup_measurable():
            return f"no measurable difference (median {ratio:.2f}x of {len(rounds)} alternating rounds, {spread})"
        return f"{ratio:.2f}x (median of {len(rounds)} alternating rounds, {spread})"

    def speedup(self) -> float | None:
        """Baseline latency over combined latency, when both ran: the median of the rounds' ratios.

        Each round times both modules back to back, so a slow spell of a busy machine slows both
        and cancels in the ratio, where a ratio of two separate medians would keep it.
        """
        if self.round_speedups:
            return float(np.median(self.round_speedups))
        if len(self.variants) == 2 and all(v.latency_s for v in self.variants):
            return self.variants[0].latency_s / self.variants[1].latency_s
        return None

    def tuning_gain(self) -> float | None:
        """Untuned baseline latency over tuned baseline latency (> 1: tuning paid), where both were timed."""
        tuned = self.variants[0].latency_s if self.variants else None
        if self.untuned is None or not self.untuned.latency_s or not tuned:
            return None
        return self.untuned.latency_s / tuned

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON values (``--json``): seconds, not milliseconds."""
        return {"ok": True, "model": self.model, "ir": self.ir, "target": self.target, "batch": self.batch,
                "seq": self.seq, "variants": [asdict(v) for v in self.variants], "speedup": self.speedup(),
                "speedup_measurable": self.speedup_measurable(),
                "speedup_rounds": list(self.round_speedups), "combine_as": self.combine_as,
                "groups": list(self.groups), "executed": self.executed, "note": self.note,
                "onnxruntime": {"latency_s": self.ort_latency_s, "threads": self.ort_threads},
                "inputs": dict(self.inputs), "untuned_baseline": None if self.untuned is None else asdict(self.untuned),
                "tuning_gain": self.tuning_gain()}

    def render(self) -> str:
        out = [f"model {self.model}  ir {self.ir}  target {self.target}  {self.sizes()}", self.table()]
        out.append(f"combined groups: {len(self.groups)}" + (f" (combined as {self.combine_as})" if self.groups else ""))
        out += [f"  {g}" for g in self.groups]
        if self.note:
            out.append(self.note)
        return "\n".join(out)


def _exact(a: np.ndarray) -> bool:
    """Integer and bool outputs (ids, masks, counts) must match exactly: no tolerance of their scale."""
    return a.dtype.kind in "biu"


def output_diff(output: np.ndarray, reference: np.ndarray) -> float:
    """max |output - reference| in float64; equal NaNs and equal infinities agree; NaN where the shapes
    differ or a NaN or infinity meets another value (no number says how far apart those are)."""
    a, b = np.asarray(output), np.asarray(reference)
    if a.shape != b.shape:
        return math.nan
    if a.size == 0:
        return 0.0
    if _exact(a) and _exact(b):  # int64 ids past 2**53 differ by 1, equal in float64: Python ints
        differ = a != b
        return float(max((abs(int(x) - int(y)) for x, y in zip(a[differ], b[differ])), default=0))
    a, b = a.astype(np.float64), b.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    if not np.all(same | (np.isfinite(a) & np.isfinite(b))):
        return math.nan
    with np.errstate(invalid="ignore"):  # inf - inf where they agree: masked, not a warning on stderr
        return float(np.max(np.abs(np.where(same, 0.0, a - b))))


def output_diffs(outputs: list[np.ndarray], reference: list[np.ndarray]) -> list[float]:
    """:func:`output_diff` of each output."""
    if len(outputs) != len(reference):
        raise ValueError(f"{len(outputs)} outputs but {len(reference)} reference outputs")
    return [output_diff(o, r) for o, r in zip(outputs, reference)]


def largest(diffs: list[float]) -> float:
    """The largest difference; NaN if any is (Python's max would drop it)."""
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)


def max_abs_diff(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The largest :func:`output_diff` over all outputs; NaN if any is."""
    return largest(output_diffs(outputs, reference))


class UserError(ValueError):
    """A problem the user fixes outside the model (a folder, a file beside it), said in one line: exit 2."""


class JobError(Exception):
    """A stage of the job failed; ``str`` is one line: ``<file>: <stage>: <what is wrong>``.

    ``bad_input`` tells the model (or an option) apart from a bug of ours: the CLI exits 2 for
    the first and 1 for the second. The original exception is the ``__cause__``.
    """

    def __init__(self, path: str | None, stage: str, problem: str, bad_input: bool = True) -> None:
        self.path, self.stage, self.problem, self.bad_input = path, stage, problem, bad_input
        super().__init__(f"{path}: {stage}: {problem}" if path else problem)

    @property
    def exit_code(self) -> int:
        return 2 if self.bad_input else 1

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.path, "stage": self.stage, "message": self.problem, "bad_input": self.bad_input,
                "exit_code": self.exit_code}


@contextmanager
def _stage(path: str, stage: str, what: str, bad_input: bool) -> Iterator[None]:
    """Turn any failure inside the block into a JobError naming ``stage``.

    ``what`` prefixes the message of an unexpected exception (a ModelError already says it all).
    A Ctrl-C inside the block ends it in KeyboardInterrupt, whatever TVM made of it.
    """
    try:
        with keep_interrupts():
            yield
    except JobError:
        raise
    except ModelError as err:
        raise JobError(path, stage, err.problem, bad_input=True) from err
    except UserError as err:
        raise JobError(path, stage, str(err), bad_input=True) from err
    except MemoryError as err:  # sizes the user asked for (a review's --batch 100000 --seq 1000000: 11.6 TiB)
        raise JobError(path, stage, f"{what}: out of memory ({first_line(err)})", bad_input=True) from err
    except Exception as err:
        problem = first_line(err)
        if not bad_input:
            problem = f"{type(err).__name__}: {problem}" if not problem.startswith(type(err).__name__) else problem
        raise JobError(path, stage, f"{what}: {problem}", bad_input) from err


#: TVM's ONNX frontends say this when a model uses an op they have no converter for.
_UNSUPPORTED = "The following operators are not supported for frontend ONNX: "


def _import_problem(err: Exception, ir: str) -> str:
    message = first_line(err)
    if message.startswith(_UNSUPPORTED):
        ops = message[len(_UNSUPPORTED):].strip()
        plural = "s" if "," in ops else ""
        return f"TVM's {ir.capitalize()} ONNX frontend does not support the op{plural} {ops}"
    return f"TVM's {ir.capitalize()} ONNX frontend cannot import the model: {message}"


def ir_problem(ir: str) -> str | None:
    """Why ``ir`` cannot run in this environment (None when it can), with what to use instead.

    Importing the IR's package is the test: it fails exactly where a job would.
    """
    if ir not in IRS:
        return f"unknown IR {ir!r}: expected 'relax' or 'relay'"
    try:
        if ir == "relax" and importlib.util.find_spec("tvm_ffi") is None:  # TVM < 0.27: say why plainly
            raise ModuleNotFoundError("No module named 'tvm_ffi'")
        importlib.import_module(f"tvm_combiners.{ir}.job")
    except Exception as err:  # ImportError mostly; an old TVM may fail in other ways on import
        try:
            import tvm

            version = f"TVM {tvm.__version__}"
        except ImportError:
            version = "no TVM"
        if ir == "relax":
            return (f"--ir relax needs apache-tvm >= 0.27 (with tvm_ffi); this environment has {version} "
                    f"({first_line(err)}): use --ir relay here, or the main environment (.venv/bin/tvm-combiners)")
        return (f"--ir relay needs a TVM build with Relay (upstream <= 0.19 or hhb-tvm); this environment has "
                f"{version} without it: use --ir relax here, or the Relay environment (.venv-relay/bin/tvm-combiners)")
    return None


def default_ir() -> str:
    """The IR this environment runs: Relax where apache-tvm 0.27 is installed, else Relay."""
    problems = {ir: ir_problem(ir) for ir in IRS}
    for ir in IRS:
        if problems[ir] is None:
            return ir
    raise JobError(None, "setup", "this environment can run neither IR: " + "; ".join(p for p in problems.values() if p))


def _backend(ir: str) -> Backend:
    problem = ir_problem(ir)
    if problem is not None:
        raise JobError(None, "setup", problem)
    if ir == "relax":
        from .relax.job import RelaxBackend

        return RelaxBackend()
    from .relay.job import RelayBackend

    return RelayBackend()


def run_job(model_path: str | None = None, target: str = "llvm", ir: str | None = None, batch: int = 1, seq: int = 128,
            combine: bool = True, repeat: int = 5, log: TextIO | None = None, tune: int | None = None,
            tune_dir: str | None = None, stack: bool = True, tune_tasks: str = "all") -> JobReport:
    """Run the whole job; ``ir=None`` picks the environment's IR. Failures raise :class:`JobError`.

    ``tune=TRIALS`` tunes every module with MetaSchedule (the same budget per task for each) before
    compiling; tasks already in the database under ``tune_dir`` are reused, not tuned again.
    ``tune_tasks="gemm"`` tunes only the GEMM and convolution tasks, leaving the rest to the
    default schedules (dlight on cuda, where tuning all at a small budget lost to them; ours on llvm).
    ``stack`` runs the combiners with ``to_batch``: equal-width matmul branches become one batched
    matmul, so each branch keeps its own weight layout and kernel shape. Tuned on CPU, one wide
    GEMM over concatenated weights ran 0.79x-0.86x of the baseline on BERT-base; stacked, 1.01x.
    """
    def progress(msg: str) -> None:
        print(f"[tvm-combiners] {msg}", file=log or sys.stderr, flush=True)

    if target not in ("llvm", "cuda"):
        raise JobError(None, "setup", f"unknown target {target!r}: expected 'llvm' or 'cuda'")
    if tune_tasks not in TUNE_TASKS:
        raise JobError(None, "setup", f"unknown tune_tasks {tune_tasks!r}: expected one of {', '.join(TUNE_TASKS)}")
    ir = ir or default_ir()
    backend = _backend(ir)
    problem = backend.target_problem(target)
    if problem is None and tune is not None:
        problem = backend.tune_problem(target, tune_dir)
    if problem is not None:
        raise JobError(None, "setup", problem)
    with _stage("(default model)", "load", "cannot locate the default model", bad_input=True):
        path = str(model_path or default_model_path())
    with _stage(path, "load", "cannot load the model", bad_input=True):
        progress(f"loading {path}")
        model = load_onnx(path)
    with _stage(path, "prepare", "cannot prepare the model", bad_input=False):
        progress(f"preparing (batch {batch}, seq {seq})")
        model = prepare_onnx(model, batch, seq)
        inputs = example_inputs(model, batch, seq)
    # the shapes it ran on, not --batch/--seq: a model may fix its sizes, or have no sequence axis
    shapes = input_shapes({name: array.shape for name, array in inputs.items()})
    with _stage(path, "reference", f"onnxruntime fails to run the model on inputs {shapes}", bad_input=True):
        progress("running onnxruntime for reference outputs")
        reference = run_onnxruntime(model, inputs)
    progress(f"importing into {ir}")
    try:
        with keep_interrupts():
            baseline = backend.import_model(model)
    except Exception as err:
        raise JobError(path, "import", _import_problem(err, ir)) from err
    report = JobReport(path, ir, target, batch, seq, combine_as="stack" if stack else "concat",
                       inputs={name: list(array.shape) for name, array in inputs.items()})
    modules = [("baseline", baseline)]
    if combine:
        with _stage(path, "combine", "internal error in the combiner passes", bad_input=False):
            progress("combining parallel ops")
            combined = backend.combine(baseline, lambda cand: report.groups.append(cand.describe()), stack)
        modules.append(("combined", combined))
    executable = target == "llvm" or backend.has_gpu()
    if not executable:
        report.executed = False
        report.note = "no CUDA GPU here: compiled for cuda, not executed"
    outputs: dict[str, list[np.ndarray]] = {}
    diffs: dict[str, list[float]] = {}  # per output, from onnxruntime
    runnable: list[tuple[Variant, Any]] = []
    for label, mod in modules:
        # The baseline is TVM on the user's model: its failure is a model TVM cannot handle here
        # (exit 2). The combined module failing where the baseline worked is our bug (exit 1).
        is_baseline = label == "baseline"
        tuned = None
        if tune is not None:
            with _stage(path, "tune", f"MetaSchedule cannot tune the {label} module for {target}", bad_input=False):
                progress(f"tuning {label} for {target} ({tune} trials per task)")
                with on_start_cores():  # its builders and runners would inherit the pin of TVM's pool
                    tuned = backend.tune(mod, target, tune, tune_dir, progress, tune_tasks)
        with _stage(path, "compile", f"TVM cannot compile the {label} module for {target}", bad_input=is_baseline):
            progress(f"compiling {label} for {target}")
            start = time.perf_counter()
            built = backend.compile(mod, target) if tuned is None else backend.compile_tuned(mod, target, tuned[0])
            variant = Variant(label, backend.count_ops(mod), time.perf_counter() - start)
            variant.tuning = None if tuned is None else asdict(tuned[1])
        if executable:
            with _stage(path, "run", f"running the {label} module failed", bad_input=is_baseline):
                progress(f"running {label}")
                outputs[label] = backend.run(built, inputs, target)
                diffs[label] = output_diffs(outputs[label], reference)
                variant.max_abs_diff = largest(diffs[label])
            runnable.append((variant, built))
        report.variants.append(variant)
    if "baseline" in outputs:
        report.note = "\n".join(filter(None, [report.note, reference_disagreement(diffs["baseline"], reference)]))
    untuned = None
    if tune is not None and outputs:
        untuned = _TunedCheck(path, backend, baseline, inputs, reference, target, progress)
        untuned.check("baseline", baseline, outputs["baseline"])
    if "combined" in outputs:
        try:
            _check_combined(path, outputs["combined"], outputs["baseline"], diffs["baseline"])
        except JobError:
            if untuned is not None:  # the combiner's fault, or the combined module's tuned schedules'?
                untuned.check("combined", dict(modules)["combined"], outputs["combined"], blame_tuning_only=True)
            raise
    if runnable:
        with _stage(path, "run", "timing the modules failed", bad_input=False):
            # the untuned baseline in the same rounds: its ratio to the tuned one decides "deploy untuned"
            extra = [] if untuned is None else [(untuned.variant, untuned.plain_built)]
            _time_alternating(backend, runnable, inputs, target, repeat, report, progress, extra)
            report.untuned = None if untuned is None else untuned.variant
    with _stage(path, "reference", "onnxruntime fails to time the model", bad_input=False):
        report.ort_threads = cpu_threads()
        progress(f"timing onnxruntime ({repeat} runs, {report.ort_threads} thread{'s' * (report.ort_threads != 1)})")
        report.ort_latency_s = time_onnxruntime(model, inputs, repeat, report.ort_threads)
    return report


#: Timing alternates between the modules in this many rounds (fewer when ``repeat`` is smaller).
ROUNDS = 10
#: A median ratio this close to 1 is no difference: more rounds are not timed to tell it apart.
UNDECIDED = 0.02


def _time_alternating(backend: Backend, runnable: list[tuple[Variant, Any]], inputs: dict[str, np.ndarray],
                      target: str, repeat: int, report: JobReport, progress: Any,
                      extra: list[tuple[Variant, Any]] = ()) -> None:
    """``repeat`` timed runs per module, in rounds that time every module back to back (``extra``
    ones too, outside the speedup).

    A latency is the median of its rounds' medians; the speedup, the median of the rounds' ratios.
    """
    timed = [*runnable, *extra]
    rounds = max(1, min(ROUNDS, repeat))
    runs = -(-repeat // rounds)  # at least ``repeat`` runs in all
    *rest, last = [v.label for v, _ in timed]
    labels = f"{', '.join(rest)} and {last}" if rest else last
    progress(f"timing {labels}: {rounds} alternating round{'s' * (rounds > 1)} of {runs} run{'s' * (runs > 1)} each")
    samples: list[list[float]] = [[] for _ in timed]

    def time_rounds(count: int) -> None:
        for _ in range(count):
            for times, (_variant, built) in zip(samples, timed):
                times.append(backend.time(built, inputs, target, runs))

    time_rounds(rounds)
    if len(runnable) == 2 and rounds >= 3 and report.groups:
        # the median's interval holds 1 while the median is off it: as many rounds again narrow it
        ratios = [b / c for b, c in zip(*samples[:2])]
        low, high = median_interval(ratios)
        if low <= 1.0 <= high and abs(float(np.median(ratios)) - 1.0) > UNDECIDED:
            progress(f"the median's interval over the rounds is {low:.2f}x-{high:.2f}x: {rounds} more rounds")
            time_rounds(rounds)
    for (variant, _), times in zip(timed, samples):
        variant.latency_s = float(np.median(times))
    if len(runnable) == 2:
        report.round_speedups = [b / c for b, c in zip(*samples[:2])]


#: The smallest output scale the check's tolerance is relative to: an output of all zeros may still
#: differ by ``rtol * CHECK_SCALE_FLOOR`` (float32 rounding of terms that cancel).
CHECK_SCALE_FLOOR = 1e-3
#: How far beyond the baseline's own distance from onnxruntime the combined module may stray.
NOISE_FACTOR = 10.0
#: ... but never more than this share of the output's scale: a baseline far from onnxruntime (a
#: frontend that computes something else) made the allowance so wide that random numbers passed.
NOISE_CAP = 0.05


def _scale(output: np.ndarray) -> float:
    """The largest finite magnitude of an output, at least :data:`CHECK_SCALE_FLOOR`."""
    b64 = np.asarray(output).astype(np.float64)
    finite = np.abs(b64[np.isfinite(b64)])
    return max(float(finite.max()) if finite.size else 0.0, CHECK_SCALE_FLOOR)


def reference_disagreement(noise: list[float], reference: list[np.ndarray]) -> str | None:
    """The report's line where TVM's baseline is further (``noise``, per output) from onnxruntime's
    ``reference`` than float32 noise explains (beyond :data:`NOISE_CAP` of an output's scale): the
    numbers then check TVM against itself only."""
    for i, (diff, r) in enumerate(zip(noise, reference, strict=True)):
        scale = _scale(r)
        if not diff <= NOISE_CAP * scale:
            return (f"warning: TVM's baseline differs from onnxruntime by {diff:.3g} on output {i} (scale "
                    f"{scale:.3g}): TVM computes something else for this model; the combined module is "
                    "checked against the baseline")
    return None


def _check_combined(path: str, combined: list[np.ndarray], baseline: list[np.ndarray],
                    noise: list[float] | None = None, rtol: float = 1e-4) -> None:
    """A combined module must compute what the baseline does: never report a changed result as success.

    Output by output, against that output's own scale (one large output must not hide another's
    error), or, where larger, ``NOISE_FACTOR`` times the baseline's own distance from onnxruntime
    (``noise``, per output): an output computed by cancellation (a small difference of large sums)
    carries float32 noise far above its own scale, which two correct evaluations in other orders show.
    """
    problem = _difference(combined, baseline, noise, rtol, "the combined module", "the baseline's")
    if problem is not None:
        raise JobError(path, "check", problem, bad_input=False)


def _difference(got: list[np.ndarray], want: list[np.ndarray], noise: list[float] | None, rtol: float,
                name: str, ref: str) -> str | None:
    """How ``got`` (``name``'s outputs) differs from ``want`` (``ref``) beyond :func:`_check_combined`'s
    tolerance, or None."""
    noise = [0.0] * len(want) if noise is None else noise
    for i, (c, b, off) in enumerate(zip(got, want, noise, strict=True)):
        c, b = np.asarray(c), np.asarray(b)
        diff = output_diff(c, b)
        scale = _scale(b)
        tol = max(rtol * scale, 0.0 if math.isnan(off) else min(NOISE_FACTOR * off, NOISE_CAP * scale))
        if _exact(c) and _exact(b):
            tol = 0.0
        if diff <= tol:
            continue
        if c.shape != b.shape:
            return f"output {i} of {name} has shape {c.shape}, {ref} {b.shape}"
        if math.isnan(diff):
            return f"output {i} of {name} has NaN or infinity where {ref} has another value"
        return f"{name}'s outputs differ from {ref} by {diff:.3e} (output {i}, allowed {tol:.1e})"
    return None


class _TunedCheck:
    """Tuned modules must compute what the untuned baseline does.

    A wrong schedule (a MetaSchedule bug, a record applied to the wrong workload) would otherwise pass
    unseen, or a wrong tuned baseline would fail the combined module's check and blame the combiner.
    Where the combined module fails its check, its untuned build tells whose fault it is.
    """

    def __init__(self, path: str, backend: Backend, baseline: Any, inputs: dict[str, np.ndarray],
                 reference: list[np.ndarray], target: str, progress: Callable[[str], None]) -> None:
        self.path, self.backend, self.inputs, self.target, self.progress = path, backend, inputs, target, progress
        self.plain, self.plain_built, compile_s = self._untuned("baseline", baseline)
        self.noise = output_diffs(self.plain, reference)  # the untuned baseline's distance from onnxruntime
        self.variant = Variant("baseline untuned", backend.count_ops(baseline), compile_s,
                               max_abs_diff=largest(self.noise))

    def _untuned(self, label: str, mod: Any) -> tuple[list[np.ndarray], Any, float]:
        """The untuned module's outputs, its build, and the seconds the build took."""
        with _stage(self.path, "check", f"TVM cannot compile or run the untuned {label} module (the tuned "
                                        "modules' reference)", bad_input=label == "baseline"):
            self.progress(f"compiling and running the untuned {label}, to check the tuned modules' outputs")
            start = time.perf_counter()
            built = self.backend.compile(mod, self.target)
            seconds = time.perf_counter() - start
            return self.backend.run(built, self.inputs, self.target), built, seconds

    def check(self, label: str, mod: Any, tuned: list[np.ndarray], blame_tuning_only: bool = False) -> None:
        """Raise where ``tuned`` differs from the untuned baseline; with ``blame_tuning_only``, only
        where ``mod`` untuned matches it (else the combiner is at fault: the caller says so)."""
        if blame_tuning_only and _difference(self._untuned(label, mod)[0], self.plain, self.noise, 1e-4, "", ""):
            return
        problem = _difference(tuned, self.plain, self.noise, 1e-4, f"the tuned {label} module",
                              "the untuned baseline's")
        if problem is not None:
            raise JobError(self.path, "check", f"{problem}: a tuned schedule computes something else (delete the "
                                               "--tune-dir records to tune afresh)", bad_input=True)
