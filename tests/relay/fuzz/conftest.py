"""The Relay fuzz tests share the IR-neutral specs in tests/fuzz and print how many graphs they checked."""

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "fuzz"))

import fuzz_stats  # noqa: E402

#: A fuzzed program whose recv ran before its send would wait the runtime's default 300 s (ranks
#: launched by a test inherit it): a miscompile fails in a minute instead.
os.environ.setdefault("TVM_COMBINERS_RECV_TIMEOUT", "60")


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001 - pytest's hook signature
    lines = fuzz_stats.summary_lines()
    if lines:
        terminalreporter.section("fuzzed graphs (modules: hypothesis examples; combined: the pass changed it)")
        for line in lines:
            terminalreporter.write_line(line)
