"""The main job, stage by stage: load, prepare, reference, import, combine, compile and run, check, time."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import numpy as np

from ...compile.host import on_start_cores
from ...compile.interrupts import keep_interrupts
from ...compile.tuning import TUNE_TASKS
from ...models import default_model_path, example_inputs, load_onnx, prepare_onnx, run_onnxruntime, time_onnxruntime
from ...models.loader import cpu_threads, input_specs
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
    input_shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None


def run_job(model_path: str | None = None, target: str = "llvm", ir: str | None = None, batch: int = 1, seq: int = 128,
            combine: bool = True, repeat: int = 5, log: TextIO | None = None, tune: int | None = None,
            tune_dir: str | None = None, stack: bool = True, tune_tasks: str = "all",
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None) -> JobReport:
    """Run the whole job; ``ir=None`` picks the environment's IR. Failures raise :class:`JobError`.

    ``input_shapes`` (input name -> shape) sizes those inputs outright, ``batch`` and ``seq`` the
    dynamic axes left. ``inputs`` (an ``.npz`` file or name -> array) runs the model on that data
    instead of generated inputs: it must name every input of the model and no other, and its
    arrays' shapes size the inputs (as ``input_shapes`` would).

    ``tune=TRIALS`` tunes every module with MetaSchedule (the same budget per task for each) before
    compiling; tasks already in the database under ``tune_dir`` are reused, not tuned again.
    ``tune_tasks="gemm"`` tunes only the GEMM and convolution tasks, leaving the rest to the
    default schedules (dlight on cuda, where tuning all at a small budget lost to them; ours on llvm).
    ``stack`` is the passes' ``to_batch``: matmul branches of one width on one input become one
    batched matmul, so each branch keeps its own weight layout and kernel shape (on CPU, tuned, one
    wide GEMM over concatenated weights is slower than the baseline on BERT-base; stacked, it is not).
    """
    options = JobOptions(model_path, target, ir, batch, seq, combine, repeat, tune, tune_dir, stack, tune_tasks,
                         dict(input_shapes or {}), inputs)
    return _Job(options, log).run()


#: A step that takes at least this long says how long when it ends: a user sees where the minutes go.
SLOW_STEP_S = 2.0


class _Job:
    """One run of the main job: each stage a method, the state they hand on in attributes."""

    def __init__(self, options: JobOptions, log: TextIO | None) -> None:
        self.options, self.log = options, log
        self.path = "(default model)"
        self.outputs: dict[str, list[np.ndarray]] = {}
        self.diffs: dict[str, list[float]] = {}  # per output, from onnxruntime
        self.runnable: list[tuple[Variant, Any]] = []
        self.untuned: TunedCheck | None = None
        self.given: dict[str, np.ndarray] | None = None  # the user's input data

    def progress(self, msg: str) -> None:
        print(f"[tvm-combiners] {msg}", file=self.log or sys.stderr, flush=True)

    @contextmanager
    def step(self, msg: str, announce: bool = True) -> Iterator[None]:
        """Say ``msg`` as the step starts (unless the step says it itself: ``announce=False``), and how
        long it took where that was :data:`SLOW_STEP_S` or more."""
        if announce:
            self.progress(msg)
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        if seconds >= SLOW_STEP_S:
            self.progress(f"{msg}: {seconds:.1f} s")

    def run(self) -> JobReport:
        self.setup()
        self.load()
        self.load_inputs()
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
        with job_stage(self.path, "load", "cannot load the model", bad_input=True), self.step(f"loading {self.path}"):
            self.model = load_onnx(self.path)

    def load_inputs(self) -> None:
        """The user's input data (``inputs``), checked against the model's input names."""
        given = self.options.inputs
        if given is None:
            return
        source = "the inputs given" if isinstance(given, Mapping) else str(given)
        with job_stage(self.path, "inputs", f"cannot read {source}", bad_input=True):
            if isinstance(given, Mapping):
                arrays = {str(k): np.asarray(v) for k, v in given.items()}
            else:
                self.progress(f"reading inputs from {source}")
                with np.load(given, allow_pickle=False) as npz:
                    arrays = {k: npz[k] for k in npz.files}
        names = list(input_specs(self.model))
        missing = [n for n in names if n not in arrays]
        extra = [n for n in arrays if n not in names]
        if missing or extra:
            what = "; ".join(filter(None, [missing and f"no array for input {', '.join(map(repr, missing))}",
                                           extra and f"{', '.join(map(repr, extra))} is no input of the model"]))
            raise JobError(self.path, "inputs", f"{source}: {what} (the model's inputs: {', '.join(names)})")
        self.given = {n: arrays[n] for n in names}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes the inputs are given: ``input_shapes``, and the user's arrays' (which must agree)."""
        shapes = {name: tuple(shape) for name, shape in self.options.input_shapes.items()}
        for name, array in (self.given or {}).items():
            if shapes.setdefault(name, array.shape) != array.shape:
                raise JobError(self.path, "inputs", f"input {name!r}: the array given has shape {array.shape}, the "
                                                    f"input shapes say {shapes[name]}")
        return shapes

    def prepare(self) -> None:
        """Fix the model's input sizes and make its example inputs (or check the user's against it)."""
        o = self.options
        shapes = self.shapes()
        sizes = ", ".join(f"{n} {'x'.join(map(str, s)) or 'scalar'}" for n, s in shapes.items())
        with (job_stage(self.path, "prepare", "cannot prepare the model", bad_input=False),
              self.step(f"preparing ({sizes + '; ' if sizes else ''}batch {o.batch}, seq {o.seq})")):
            self.model = prepare_onnx(self.model, o.batch, o.seq, shapes)
            self.inputs = self.given if self.given is not None else example_inputs(self.model, o.batch, o.seq)
        for name, (_, dtype) in input_specs(self.model).items():
            if self.given is not None and self.given[name].dtype != dtype:
                raise JobError(self.path, "inputs", f"input {name!r} is {dtype} in the model, the array given is "
                                                    f"{self.given[name].dtype}")

    def reference(self) -> None:
        """onnxruntime's outputs, which every module is compared with."""
        # the shapes it ran on, not --batch/--seq: a model may fix its sizes, or have no sequence axis
        shapes = input_shapes({name: array.shape for name, array in self.inputs.items()})
        with (job_stage(self.path, "reference", f"onnxruntime fails to run the model on inputs {shapes}", bad_input=True),
              self.step("running onnxruntime for reference outputs")):
            self.reference_outputs = run_onnxruntime(self.model, self.inputs)

    def import_model(self) -> None:
        """The model in the IR: the baseline module."""
        o = self.options
        try:
            with keep_interrupts(), self.step(f"importing into {self.ir}"):
                self.baseline = self.backend.import_model(self.model)
        except Exception as err:
            raise JobError(self.path, "import", import_problem(err, self.ir)) from err
        self.report = JobReport(self.path, self.ir, o.target, o.batch, o.seq, combine_as="stack" if o.stack else "concat",
                                inputs={name: list(array.shape) for name, array in self.inputs.items()},
                                shapes_given=bool(o.input_shapes) or self.given is not None,
                                all_given=self.given is not None or set(o.input_shapes or ()) >= set(self.inputs),
                                inputs_file=None if o.inputs is None or isinstance(o.inputs, Mapping) else str(o.inputs))
        self.executable = o.target == "llvm" or self.backend.has_gpu()
        if not self.executable:
            self.report.executed = False
            self.report.note = "no CUDA GPU here: compiled for cuda, not executed"

    def combine(self) -> None:
        """The combined module beside the baseline (unless combining is off)."""
        self.modules: list[tuple[str, Any]] = [("baseline", self.baseline)]
        if not self.options.combine:
            return
        with (job_stage(self.path, "combine", "internal error in the combiner passes", bad_input=False),
              self.step("combining parallel ops")):
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
            with (job_stage(self.path, "tune", f"MetaSchedule cannot tune the {label} module for {o.target}",
                            bad_input=False), self.step(f"tuning {label} for {o.target} ({o.tune} trials per task)")):
                with on_start_cores():  # its builders and runners would inherit the pin of TVM's pool
                    tuned = self.backend.tune(mod, o.target, o.tune, o.tune_dir, self.progress, o.tune_tasks)
        with (job_stage(self.path, "compile", f"TVM cannot compile the {label} module for {o.target}",
                        bad_input=is_baseline), self.step(f"compiling {label} for {o.target}")):
            start = time.perf_counter()
            built = (self.backend.compile(mod, o.target) if tuned is None
                     else self.backend.compile_tuned(mod, o.target, tuned[0]))
            variant = Variant(label, self.backend.count_ops(mod), time.perf_counter() - start)
            variant.tuning = None if tuned is None else asdict(tuned[1])
        if self.executable:
            with (job_stage(self.path, "run", f"running the {label} module failed", bad_input=is_baseline),
                  self.step(f"running {label}")):
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
        with (job_stage(self.path, "run", "timing the modules failed", bad_input=False),
              self.step("timing the modules", announce=False)):
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
            with self.step(f"timing onnxruntime ({repeat} runs, {report.ort_threads} "
                           f"thread{'s' * (report.ort_threads != 1)})"):
                report.ort_latency_s = time_onnxruntime(self.model, self.inputs, repeat, report.ort_threads)
