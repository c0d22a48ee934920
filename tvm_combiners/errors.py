"""Errors every layer raises and the one-line form the CLI prints of any exception."""

from __future__ import annotations

import re


class UserError(ValueError):
    """A problem the user fixes outside the model (a folder, a file beside it), said in one line: exit 2."""


def install_line(extra: str, packages: list[str]) -> str:
    """How to install what an optional feature needs: the package's extra, or the packages themselves."""
    return f"pip install 'tvm_combiners[{extra}]' (or: pip install {' '.join(packages)})"


class MissingExtra(ImportError):
    """An optional feature whose packages are not installed; the message names the extra that installs them."""

    def __init__(self, what: str, extra: str, packages: list[str]) -> None:
        self.extra, self.packages = extra, packages
        super().__init__(f"{what} needs {', '.join(packages)}: {install_line(extra, packages)}")


def first_line(err: BaseException) -> str:
    """The informative line of an exception's message: no C++ backtraces, source paths or codes.

    TVM and onnxruntime errors carry multi-line backtraces and ``file.cc:123 signature`` prefixes;
    a user needs only the sentence that says what is wrong.
    """
    text = str(err).strip()
    if isinstance(err, KeyError) and err.args:
        text = f"KeyError: {err.args[0]!r}"
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(("Traceback", "File ", "Stack trace"))
             and not re.match(r"^\d+: ", line)]
    line = lines[0] if lines else type(err).__name__
    if line.startswith("==>") and len(lines) > 1:
        line = lines[1]
    elif line.endswith((":", "indices")) and len(lines) > 1:  # onnxruntime goes on: "index: 0 Got: 8 Expected: 0"
        line = f"{line} {lines[1]}"
    line = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", line)
    line = re.sub(r"^Load model from .*? failed:", "", line)
    line = re.sub(r"^\S+\.(?:cc|cpp|h):\d+ (?:[\w:<>~]+\([^)]*\)(?: const)? )?", "", line)
    line = re.sub(r"^\S+\.(?:cc|cpp|h):\d+: ", "", line)
    line = re.sub(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", line)  # TVM's "[12:00:00] /src/file.h:449: "
    return line if len(line) <= 400 else line[:397] + "..."

