"""Differential fuzzing of the Relax collective combiners on 2 ranks, where collectives are not identities.

The one-rank fuzzer (``test_fuzz_collectives_relax.py``) cannot see an allgather's blocks out of
order, a reduce_scatter's block given to the wrong rank, a ring's sends paired wrongly or a
reduction of the wrong ranks: on one rank all of them are the identity. Here one launch runs
``collective_world_prog.py`` on 2 ranks over programs of ``collective_spec`` (read for the world
by ``collective_world``, whose folds keep each value's type and every block's order visible),
each unoptimized and after every setting of ``PASS_SETTINGS`` (``collective_world_harness``).
Unset, ``FUZZ_EXAMPLES`` keeps a small slice (seed 0) for ``make test``; set, it is the number of
programs, drawn from ``FUZZ_SEED`` (else a random seed, printed), on ``FUZZ_RANKS`` ranks (default 2).
"""

from __future__ import annotations

from pathlib import Path

from collective_world_harness import run_world_test

#: Programs of the CI slice (each runs every pass setting): about 35 s on 2 busy cores.
CI_PROGRAMS = 8


def test_fuzz_collective_combiners_on_n_ranks(tmp_path: Path) -> None:
    run_world_test(Path(__file__).with_name("collective_world_prog.py"), tmp_path, "Relax", CI_PROGRAMS,
                   seconds_per_program=10)  # a program takes 2-5 s on 2 busy cores
