"""How a stage of the main job fails: one line naming the file, the stage and what is wrong."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...compile.interrupts import keep_interrupts
from ...errors import UserError, first_line
from ...models import ModelError


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
def job_stage(path: str, stage: str, what: str, bad_input: bool) -> Iterator[None]:
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
    except MemoryError as err:  # sizes the user asked for (--batch 100000 --seq 1000000 would need 11.6 TiB)
        raise JobError(path, stage, f"{what}: out of memory ({first_line(err)})", bad_input=True) from err
    except Exception as err:
        problem = first_line(err)
        if not bad_input:
            problem = f"{type(err).__name__}: {problem}" if not problem.startswith(type(err).__name__) else problem
        raise JobError(path, stage, f"{what}: {problem}", bad_input) from err


#: TVM's ONNX frontends say this when a model uses an op they have no converter for.
_UNSUPPORTED = "The following operators are not supported for frontend ONNX: "


def import_problem(err: Exception, ir: str) -> str:
    message = first_line(err)
    if message.startswith(_UNSUPPORTED):
        ops = message[len(_UNSUPPORTED):].strip()
        plural = "s" if "," in ops else ""
        return f"TVM's {ir.capitalize()} ONNX frontend does not support the op{plural} {ops}"
    return f"TVM's {ir.capitalize()} ONNX frontend cannot import the model: {message}"
