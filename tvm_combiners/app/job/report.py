"""The main job's report: each module's counts, compile time, latency and difference, and the speed-up."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..text_table import table


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
    shapes_given: bool = False  # input shapes or data came from the user, not --batch/--seq alone
    all_given: bool = False  # every input's shape came from the user: --batch/--seq sized nothing
    inputs_file: str | None = None  # the .npz the inputs came from

    def sizes_used(self) -> dict[str, int | None]:
        """``--batch`` and ``--seq`` where they sized an input, None where they did not (``--json``'s values)."""
        shapes = list(self.inputs.values())
        # a size applied wherever it stands (a named dim may put the batch on axis 1, --seq sets an
        # image's height and width): it does not apply only where no input has it at all
        return {name: None if self.all_given or (shapes and not any(size in shape for shape in shapes)) else size
                for name, size in (("batch", self.batch), ("seq", self.seq))}

    def sizes(self) -> str:
        """``batch B  seq S``; the input shapes instead where the user gave them, or where the model fixed
        a size that --batch/--seq asked otherwise."""
        if self.shapes_given:
            return f"inputs {input_shapes(self.inputs)}" + (f" from {self.inputs_file}" if self.inputs_file else "")
        unused = [f"--{name} {getattr(self, name)}" for name, size in self.sizes_used().items() if size is None]
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
                defaults = "the default schedules (" + ("dlight" if self.target == "cuda" else "tvm_combiners' CPU rules") + ")"
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
        return {"ok": True, "model": self.model, "ir": self.ir, "target": self.target,
                **self.sizes_used(), "variants": [asdict(v) for v in self.variants], "speedup": self.speedup(),
                "speedup_measurable": self.speedup_measurable(),
                "speedup_rounds": list(self.round_speedups), "combine_as": self.combine_as,
                "groups": list(self.groups), "executed": self.executed, "note": self.note,
                "onnxruntime": {"latency_s": self.ort_latency_s, "threads": self.ort_threads},
                "inputs": dict(self.inputs), "inputs_file": self.inputs_file, "untuned_baseline": None if self.untuned is None else asdict(self.untuned),
                "tuning_gain": self.tuning_gain()}

    def render(self) -> str:
        out = [f"model {self.model}  ir {self.ir}  target {self.target}  {self.sizes()}", self.table()]
        out.append(f"combined groups: {len(self.groups)}" + (f" (combined as {self.combine_as})" if self.groups else ""))
        out += [f"  {g}" for g in self.groups]
        if self.note:
            out.append(self.note)
        return "\n".join(out)
