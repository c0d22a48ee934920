"""Shared by both environments: a reproducible hypothesis profile for CI, the README's examples.

Locally hypothesis explores new examples every run; ``HYPOTHESIS_PROFILE=ci`` (set by .ci/run)
derandomizes it so a CI result can be reproduced exactly.
"""

import os
import re
from pathlib import Path

import pytest
from hypothesis import settings

from tvm_combiners.startup import keep_torch_out_of_tvm_import

# TVM's thread pool pins the thread that starts it to one core; in the test process every program a
# later test starts (the CLI, its MPI ranks) inherited that pin and ran on one core ("2 ranks on 1
# cores"). The tests of the pin itself pin this thread explicitly.
os.environ.setdefault("TVM_BIND_THREADS", "0")

# Importing TVM 0.27 imports torch where it is installed (~3 s of a core a process): TVM's own import
# leaves it out (tvm_combiners.startup) in this process, and through tests/startup's sitecustomize in
# every Python process a test starts (each rank of a multi-rank test). An export that imports torch gets it.
STARTUP = Path(__file__).resolve().parent / "startup"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STARTUP), os.environ.get("PYTHONPATH")) if p)
keep_torch_out_of_tvm_import()

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def readme_block():
    """``readme_block(marker)``: the one python block of the README that contains ``marker``.

    The README's examples are run by tests (tests/test_readme_examples.py and its Relay twin), so
    an example that stops working fails CI instead of a user.
    """

    def find(marker: str) -> str:
        blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if marker in b]
        assert len(blocks) == 1, f"{len(blocks)} python blocks of README.md contain {marker!r}"
        return blocks[0]

    return find


@pytest.fixture(scope="module")
def cluster():
    """A simulated cluster of two nodes for the tests of one module; skipped, naming what is missing, where
    the machine cannot make one (not root, no ``ip``)."""
    from tvm_combiners.collectives.testing import ClusterUnavailable, SimulatedCluster

    try:
        with SimulatedCluster(nodes=2) as made:
            yield made
    except ClusterUnavailable as err:
        pytest.skip(str(err))
