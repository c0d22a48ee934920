"""The main job: import an ONNX model, combine, compile, run, compare with onnxruntime, report.

:func:`run_job` runs it stage by stage (:mod:`.run`); :mod:`.report` holds what it reports,
:mod:`.checks` the output checks, :mod:`.timing` the alternating rounds, :mod:`.errors` how a
stage fails.
"""

from ..compare import max_abs_diff, output_diff, output_diffs
from .checks import reference_disagreement
from .errors import JobError
from .report import JobReport, Variant, input_shapes, median_interval
from .run import JobOptions, default_ir, run_job

__all__ = ["JobError", "JobOptions", "JobReport", "Variant", "default_ir", "input_shapes", "max_abs_diff",
           "median_interval", "output_diff", "output_diffs", "reference_disagreement", "run_job"]
