"""Differential fuzzing of the Relay collective combiners on 2 ranks, where collectives are not identities.

The Relay twin of ``tests/fuzz/test_fuzz_collectives_world.py`` (one launch of
``collective_world_relay_prog.py``, graph and let form; ``collective_world_harness``). The one-rank
Relay fuzzer passes with an allgather's blocks unpacked in reverse rank order; this one fails.
Unset, ``FUZZ_EXAMPLES`` keeps a small slice (seed 0) for ``make test``; set, it is the number of
programs, drawn from ``FUZZ_SEED`` (else a random seed, printed), on ``FUZZ_RANKS`` ranks (default 2).
"""

from __future__ import annotations

from pathlib import Path

from collective_world_harness import run_world_test

#: Programs of the CI slice (a Relay build costs 1-5 s, so fewer than Relax's 8): about 20 s on 2
#: busy cores (the next three programs of seed 0 add 40 s).
CI_PROGRAMS = 5


def test_relay_fuzz_collective_combiners_on_n_ranks(tmp_path: Path) -> None:
    run_world_test(Path(__file__).with_name("collective_world_relay_prog.py"), tmp_path, "Relay", CI_PROGRAMS,
                   seconds_per_program=20)  # a program takes 3-12 s on 2 busy cores
