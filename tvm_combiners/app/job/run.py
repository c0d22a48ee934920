"""The main job, stage by stage: load, prepare, reference, import, combine, compile and run, check, time."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import numpy as np

from ...compile.host import on_start_cores
from ...compile.interrupts import keep_interrupts
from ...compile.tuning import TUNE_TASKS
from ...models import default_model_path, example_inputs, load_onnx, prepare_onnx, run_onnxruntime, time_onnxruntime
from ...models.loader import cpu_threads
from ..backends import IRS, Backend, backend, ir_problem
from ..compare import largest, output_diffs
from .checks import TunedCheck, check_combined, reference_disagreement
from .errors import JobError, import_problem, job_stage
from .report import JobReport, Variant, input_shapes
from .timing import time_alternating


def default_ir() -> str:
    """The IR this environment runs: Relax where apache-tvm 0.27 is installed, else Relay."""
    problems = {ir: ir_problem(ir) for ir in IRS}
    for ir in IRS:
        if problems[ir] is None:
            return ir
    raise JobError(None, "setup", "this environment can run neither IR: " + "; ".join(p for p in problems.values() if p))


def select_backend(ir: str) -> Backend:
    """The backend of ``ir``, or a setup error saying why this environment cannot run it."""
    problem = ir_problem(ir)
    if problem is not None:
        raise JobError(None, "setup", problem)
    return backend(ir)


@dataclass(frozen=True)
class JobOptions:
    """What :func:`run_job` was asked to do (its keyword arguments)."""

    model_path: str | None = None
    target: str = "llvm"
    ir: str | None = None
    batch: int = 1
    seq: int = 128
    combine: bool = True
    repeat: int = 5
    tune: int | None = None
    tune_dir: str | None = None
    stack: bool = True
    tune_tasks: str = "all"


def run_job(model_path: str | None = None, target: str = "llvm", ir: str | None = None, batch: int = 1, seq: int = 128,
            combine: bool = True, repeat: int = 5, log: TextIO | None = None, tune: int | None = None,
            tune_dir: str | None = None, stack: bool = True, tune_tasks: str = "all") -> JobReport:
    """Run the whole job; ``ir=None`` picks the environment's IR. Failures raise :class:`JobError`.

    ``tune=TRIALS`` tunes every module with MetaSchedule (the same budget per task for each) before
    compiling; tasks already in the database under ``tune_dir`` are reused, not tuned again.
    ``tune_tasks="gemm"`` tunes only the GEMM and convolution tasks, leaving the rest to the
    default schedules (dlight on cuda, where tuning all at a small budget lost to them; ours on llvm).
    ``stack`` runs the combiners with ``to_batch``: equal-width matmul branches become one batched
    matmul, so each branch keeps its own weight layout and kernel shape (on CPU, tuned, one wide
    GEMM over concatenated weights is slower than the baseline on BERT-base; stacked, it is not).
    """
    options = JobOptions(model_path, target, ir, batch, seq, combine, repeat, tune, tune_dir, stack, tune_tasks)
    return _Job(options, log).run()


class _Job:
    """One run of the main job: each stage a method, the state they hand on in attributes."""

    def __init__(self, options: JobOptions, log: TextIO | None) -> None:
        self.options, self.log = options, log
        self.path = "(default model)"
        self.outputs: dict[str, list[np.ndarray]] = {}
        self.diffs: dict[str, list[float]] = {}  # per output, from onnxruntime
        self.runnable: list[tuple[Variant, Any]] = []
        self.untuned: TunedCheck | None = None

    def progress(self, msg: str) -> None:
        print(f"[tvm-combiners] {msg}", file=self.log or sys.stderr, flush=True)

    def run(self) -> JobReport:
        self.setup()
        self.load()
        self.prepare()
        self.reference()
        self.import_model()
        self.combine()
        for label, mod in self.modules:
            self.compile_and_run(label, mod)
        self.check()
        self.time()
        self.time_onnxruntime()
        return self.report

    def setup(self) -> None:
        """Check the options and this environment before any work: the IR, the target, tuning."""
        o = self.options
        if o.target not in ("llvm", "cuda"):
            raise JobError(None, "setup", f"unknown target {o.target!r}: expected 'llvm' or 'cuda'")
        if o.tune_tasks not in TUNE_TASKS:
            raise JobError(None, "setup",
                           f"unknown tune_tasks {o.tune_tasks!r}: expected one of {', '.join(TUNE_TASKS)}")
        self.ir = o.ir or default_ir()
        self.backend = select_backend(self.ir)
        problem = self.backend.target_problem(o.target)
        if problem is None and o.tune is not None:
            problem = self.backend.tune_problem(o.target, o.tune_dir)
        if problem is not None:
            raise JobError(None, "setup", problem)

    def load(self) -> None:
        """Read the ONNX model (the default one where no path is given)."""
        with job_stage(self.path, "load", "cannot locate the default model", bad_input=True):
            self.path = str(self.options.model_path or default_model_path())
        with job_stage(self.path, "load", "cannot load the model", bad_input=True):
            self.progress(f"loading {self.path}")
            self.model = load_onnx(self.path)

    def prepare(self) -> None:
        """Fix the model's input sizes and make its example inputs."""
        o = self.options
        with job_stage(self.path, "prepare", "cannot prepare the model", bad_input=False):
            self.progress(f"preparing (batch {o.batch}, seq {o.seq})")
            self.model = prepare_onnx(self.model, o.batch, o.seq)
            self.inputs = example_inputs(self.model, o.batch, o.seq)

    def reference(self) -> None:
        """onnxruntime's outputs, which every module is compared with."""
        # the shapes it ran on, not --batch/--seq: a model may fix its sizes, or have no sequence axis
        shapes = input_shapes({name: array.shape for name, array in self.inputs.items()})
        with job_stage(self.path, "reference", f"onnxruntime fails to run the model on inputs {shapes}", bad_input=True):
            self.progress("running onnxruntime for reference outputs")
            self.reference_outputs = run_onnxruntime(self.model, self.inputs)

    def import_model(self) -> None:
        """The model in the IR: the baseline module."""
        o = self.options
        self.progress(f"importing into {self.ir}")
        try:
            with keep_interrupts():
                self.baseline = self.backend.import_model(self.model)
        except Exception as err:
            raise JobError(self.path, "import", import_problem(err, self.ir)) from err
        self.report = JobReport(self.path, self.ir, o.target, o.batch, o.seq, combine_as="stack" if o.stack else "concat",
                                inputs={name: list(array.shape) for name, array in self.inputs.items()})
        self.executable = o.target == "llvm" or self.backend.has_gpu()
        if not self.executable:
            self.report.executed = False
            self.report.note = "no CUDA GPU here: compiled for cuda, not executed"

    def combine(self) -> None:
        """The combined module beside the baseline (unless combining is off)."""
        self.modules: list[tuple[str, Any]] = [("baseline", self.baseline)]
        if not self.options.combine:
            return
        with job_stage(self.path, "combine", "internal error in the combiner passes", bad_input=False):
            self.progress("combining parallel ops")
            combined = self.backend.combine(self.baseline, lambda cand: self.report.groups.append(cand.describe()),
                                            self.options.stack)
        self.modules.append(("combined", combined))

    def compile_and_run(self, label: str, mod: Any) -> None:
        """Tune (under ``--tune``), compile and run one module, keeping its outputs and differences."""
        o = self.options
        # The baseline is TVM on the user's model: its failure is a model TVM cannot handle here
        # (exit 2). The combined module failing where the baseline worked is our bug (exit 1).
        is_baseline = label == "baseline"
        tuned = None
        if o.tune is not None:
            with job_stage(self.path, "tune", f"MetaSchedule cannot tune the {label} module for {o.target}", bad_input=False):
                self.progress(f"tuning {label} for {o.target} ({o.tune} trials per task)")
                with on_start_cores():  # its builders and runners would inherit the pin of TVM's pool
                    tuned = self.backend.tune(mod, o.target, o.tune, o.tune_dir, self.progress, o.tune_tasks)
        with job_stage(self.path, "compile", f"TVM cannot compile the {label} module for {o.target}", bad_input=is_baseline):
            self.progress(f"compiling {label} for {o.target}")
            start = time.perf_counter()
            built = (self.backend.compile(mod, o.target) if tuned is None
                     else self.backend.compile_tuned(mod, o.target, tuned[0]))
            variant = Variant(label, self.backend.count_ops(mod), time.perf_counter() - start)
            variant.tuning = None if tuned is None else asdict(tuned[1])
        if self.executable:
            with job_stage(self.path, "run", f"running the {label} module failed", bad_input=is_baseline):
                self.progress(f"running {label}")
                self.outputs[label] = self.backend.run(built, self.inputs, o.target)
                self.diffs[label] = output_diffs(self.outputs[label], self.reference_outputs)
                variant.max_abs_diff = largest(self.diffs[label])
            self.runnable.append((variant, built))
        self.report.variants.append(variant)

    def check(self) -> None:
        """The baseline against onnxruntime (a note), tuned modules against the untuned baseline, and the
        combined module against the baseline (an error: a changed result is never reported as success)."""
        report, outputs = self.report, self.outputs
        if "baseline" in outputs:
            report.note = "\n".join(filter(None, [report.note, reference_disagreement(self.diffs["baseline"],
                                                                                      self.reference_outputs)]))
        if self.options.tune is not None and outputs:
            self.untuned = TunedCheck(self.path, self.backend, self.baseline, self.inputs, self.reference_outputs,
                                      self.options.target, self.progress)
            self.untuned.check("baseline", self.baseline, outputs["baseline"])
        if "combined" in outputs:
            try:
                check_combined(self.path, outputs["combined"], outputs["baseline"], self.diffs["baseline"])
            except JobError:
                if self.untuned is not None:  # the combiner's fault, or the combined module's tuned schedules'?
                    self.untuned.check("combined", dict(self.modules)["combined"], outputs["combined"],
                                       blame_tuning_only=True)
                raise

    def time(self) -> None:
        """Latencies and the speed-up, in alternating rounds (the untuned baseline too, under ``--tune``)."""
        if not self.runnable:
            return
        o = self.options
        with job_stage(self.path, "run", "timing the modules failed", bad_input=False):
            # the untuned baseline in the same rounds: its ratio to the tuned one decides "deploy untuned"
            extra = [] if self.untuned is None else [(self.untuned.variant, self.untuned.plain_built)]
            time_alternating(self.backend, self.runnable, self.inputs, o.target, o.repeat, self.report, self.progress,
                             extra)
            self.report.untuned = None if self.untuned is None else self.untuned.variant

    def time_onnxruntime(self) -> None:
        """onnxruntime's latency on the same inputs, with TVM's thread count."""
        report, repeat = self.report, self.options.repeat
        with job_stage(self.path, "reference", "onnxruntime fails to time the model", bad_input=False):
            report.ort_threads = cpu_threads()
            self.progress(f"timing onnxruntime ({repeat} runs, {report.ort_threads} "
                          f"thread{'s' * (report.ort_threads != 1)})")
            report.ort_latency_s = time_onnxruntime(self.model, self.inputs, repeat, report.ort_threads)
