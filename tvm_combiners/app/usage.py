"""Command-line usage errors: the CLI and the examples' own parsers raise them, the CLI prints one line."""

from __future__ import annotations

import argparse
import re
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


_SHAPE_FORMS = "NAME:DIMxDIM... or NAME:[DIM,DIM,...] (e.g. input_ids:1x128 or pixel_values:[1,3,224,224])"


def _entries(text: str) -> list[str]:
    """Split at commas and spaces outside brackets: tvmc's ``a:[1,3] b:[2]`` and ``a:1x3,b:2`` alike."""
    entries, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0 and (char == "," or char.isspace()):
            entries.append(current)
            current = ""
        else:
            current += char
    return [e for e in [*entries, current] if e]


def parse_input_shapes(text: str, option: str = "--input-shapes") -> dict[str, tuple[int, ...]]:
    """``--input-shapes``: input name -> shape. A name may hold colons (``input:0``): the last one
    separates it from the shape. Raises :class:`UsageError` naming the entry and the forms."""
    shapes: dict[str, tuple[int, ...]] = {}
    for entry in _entries(text):
        name, _, dims = entry.rpartition(":")
        bracketed = re.fullmatch(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]", dims)
        if bracketed:
            sizes = [int(d) for d in re.split(r"\s*,\s*", bracketed.group(1))] if bracketed.group(1) else []
        elif re.fullmatch(r"\d+(?:x\d+)*", dims):
            sizes = [int(d) for d in dims.split("x")]
        else:
            raise UsageError(f"argument {option}: {entry!r} is not {_SHAPE_FORMS}")
        if not name:
            raise UsageError(f"argument {option}: {entry!r} names no input ({_SHAPE_FORMS})")
        if name in shapes:
            raise UsageError(f"argument {option}: input {name!r} is given twice")
        if any(size < 1 for size in sizes):
            raise UsageError(f"argument {option}: input {name!r}: every size must be positive, got {dims}")
        shapes[name] = tuple(sizes)
    if not shapes:
        raise UsageError(f"argument {option}: no shapes given ({_SHAPE_FORMS})")
    return shapes
