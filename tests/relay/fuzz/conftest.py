"""The Relay fuzz tests share the IR-neutral specs in tests/fuzz and print how many graphs they checked."""

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "fuzz"))

import fuzz_stats  # noqa: E402


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001 - pytest's hook signature
    lines = fuzz_stats.summary_lines()
    if lines:
        terminalreporter.section("fuzzed graphs (modules: hypothesis examples; combined: the pass changed it)")
        for line in lines:
            terminalreporter.write_line(line)
