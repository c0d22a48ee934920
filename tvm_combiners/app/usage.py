"""Command-line usage errors: the CLI and the examples' own parsers raise them, the CLI prints one line."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

PROG = "tvm-combiners"


class UsageError(ValueError):
    """A bad command line; the message names the option and the rule. ``prog``: the parser that refused it."""

    def __init__(self, message: str, prog: str = PROG) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse whose errors raise :class:`UsageError` instead of printing the usage block and exiting.

    The caller reports the error as one line (and as the JSON document under ``--json``); the
    examples use it too, so the launching process can check their options before any rank starts.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # no abbreviations: '--hel' would reach argparse's own help action (stdout, exit), '--js' would
        # be --json without the JSON error document
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)
