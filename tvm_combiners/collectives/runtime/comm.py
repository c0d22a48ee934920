"""MPI world, replica groups and source-target pairs: parsed once per string (by :mod:`..spec`,
which wrote them), checked at run time against the job's ranks.

MPI starts on first use (``from mpi4py import MPI`` initializes it), so importing the runtime costs
nothing and a program run without ``mpiexec`` is simply a world of one rank.  Sub-communicators are
made with ``Comm.Split``, which is collective: every rank creates them in the same order because
every rank runs the same program and meets the same ``groups`` strings in the same order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

from ...errors import MissingExtra
from ..spec import Groups, PairError, Pairs, decode_groups, decode_pairs

_mpi: Any = None


def mpi() -> Any:
    """The ``mpi4py.MPI`` module; importing it starts MPI (once per process)."""
    global _mpi
    if _mpi is None:
        try:
            from mpi4py import MPI
        except ImportError as err:
            raise MissingExtra("the collectives runtime", "mpi", ["mpi4py", "mpich"]) from err

        _mpi = MPI
    return _mpi


def rank() -> int:
    """This process's rank in the job (0 when not launched under mpiexec)."""
    return mpi().COMM_WORLD.Get_rank()


def world_size() -> int:
    """Number of ranks in the job (1 when not launched under mpiexec)."""
    return mpi().COMM_WORLD.Get_size()


def _malformed(op: str, attr: str, text: str) -> ValueError:
    return ValueError(f"{op}: malformed {attr} {text!r}: expected integers separated by ','")


@cache
def parse_groups(groups: str, op: str) -> Groups:
    """``"0,2;1,3"`` -> ((0, 2), (1, 3)); ``""`` -> () meaning one group of all ranks."""
    try:
        parsed = decode_groups(groups) or ()
    except ValueError:
        raise _malformed(op, "groups", groups) from None
    seen: set[int] = set()
    for group in parsed:
        for r in group:
            if r < 0:
                raise ValueError(f"{op}: groups {groups!r} names rank {r}: ranks must be >= 0")
            if r in seen:
                raise ValueError(f"{op}: groups {groups!r} names rank {r} twice: every rank must be in exactly one group")
            seen.add(r)
    return parsed


@cache
def parse_pairs(pairs: str, op: str) -> Pairs:
    """``"0,1;1,0"`` -> ((0, 1), (1, 0)), checked against StableHLO's C1-C3 (C4 needs the world size)."""
    try:
        parsed = decode_pairs(pairs)
    except PairError as e:
        raise ValueError(f"{op}: source_target_pairs {pairs!r} has {e.entry!r}: every pair needs 2 ranks (C1)") from None
    except ValueError:
        raise _malformed(op, "source_target_pairs", pairs) from None
    for index, name, rule in ((0, "source", "C2"), (1, "target", "C3")):
        ends = [p[index] for p in parsed]
        for r in ends:
            if ends.count(r) > 1:
                raise ValueError(f"{op}: source_target_pairs {pairs!r} uses {name} {r} twice: {name}s must be unique ({rule})")
    return parsed


def check_ranks(ranks: tuple[int, ...], size: int, op: str, attr: str, text: str) -> None:
    """StableHLO's C4 at run time: every named rank lies in [0, world size)."""
    for r in ranks:
        if not 0 <= r < size:
            raise ValueError(
                f"{op}: {attr} {text!r} names rank {r}, but the job has {size} rank{'s' if size != 1 else ''} "
                f"(C4: every rank must be in [0, {size}))"
            )


@dataclass
class Group:
    """This rank's replica group: its communicator, the world ranks in order, and its position."""

    comm: Any
    members: tuple[int, ...]
    position: int

    @property
    def size(self) -> int:
        return len(self.members)


_groups: dict[str, Group] = {}


def group(groups: str, op: str) -> Group:
    """This rank's group for a ``groups`` string, created on first use and cached (collective)."""
    found = _groups.get(groups)
    if found is not None:
        return found
    MPI = mpi()
    world = MPI.COMM_WORLD
    size, me = world.Get_size(), world.Get_rank()
    parsed = parse_groups(groups, op)
    if not parsed:
        found = Group(world, tuple(range(size)), me)
    else:
        check_ranks(tuple(r for g in parsed for r in g), size, op, "groups", groups)
        missing = sorted(set(range(size)) - {r for g in parsed for r in g})
        if missing:
            raise ValueError(
                f"{op}: groups {groups!r} leave out rank{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(str, missing))}: every rank must be in exactly one group"
            )
        color = next(i for i, g in enumerate(parsed) if me in g)
        members = parsed[color]
        position = members.index(me)
        # key=position orders the sub-communicator as the group lists its ranks.
        found = Group(world.Split(color, position), members, position)
    _groups[groups] = found
    return found


#: The number of disco groups (``launch --disco-groups G``): disco splits its workers into G equal runs
#: of consecutive workers, and a ``runtime.disco.*`` collective with ``in_group=True`` runs within one.
DISCO_GROUPS_ENV = "TVM_COMBINERS_DISCO_GROUPS"


def group_size(groups: int, size: int, given: str) -> int:
    """Ranks per group of ``groups`` disco groups in a job of ``size`` ranks. ValueError unless
    ``groups`` divides ``size``, its line starting with ``given`` (where the count came from)."""
    if size % groups:
        raise ValueError(f"{given} does not divide the {size} rank{'s' if size != 1 else ''}: "
                         "disco's groups are equal runs of consecutive ranks")
    return size // groups


def disco_group_size(text: str, size: int, op: str) -> int:
    """Ranks per disco group for ``TVM_COMBINERS_DISCO_GROUPS=text`` ("" means 1 group) in a job of ``size``."""
    count = text.strip() or "1"
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"{op}: {DISCO_GROUPS_ENV}={text!r} is not a positive whole number of groups")
    return group_size(int(count), size, f"{op}: {DISCO_GROUPS_ENV}={count}")


def job_disco_group_size(op: str) -> int:
    """Ranks per disco group in this job (``TVM_COMBINERS_DISCO_GROUPS``), checked."""
    return disco_group_size(os.environ.get(DISCO_GROUPS_ENV, ""), world_size(), op)


_disco_groups: dict[str, str] = {}  # by the variable's text: one parse per process, not per collective


def disco_groups(op: str) -> str:
    """The ``groups`` string of the job's disco groups (``""``: one group of every rank), checked."""
    text = os.environ.get(DISCO_GROUPS_ENV, "")
    found = _disco_groups.get(text)
    if found is None:
        size = world_size()
        per = disco_group_size(text, size, op)
        found = "" if per == size else ";".join(",".join(map(str, range(start, start + per)))
                                                for start in range(0, size, per))
        _disco_groups[text] = found
    return found


@dataclass
class Route:
    """Where this rank sends to and receives from for one ``pairs`` string (None: takes no part)."""

    target: int | None
    source: int | None


_routes: dict[str, Route] = {}


def route(pairs: str, op: str) -> Route:
    """This rank's peer in ``pairs``: parsed, C1-C4 checked, cached."""
    found = _routes.get(pairs)
    if found is not None:
        return found
    world = mpi().COMM_WORLD
    size, me = world.Get_size(), world.Get_rank()
    parsed = parse_pairs(pairs, op)
    check_ranks(tuple(r for p in parsed for r in p), size, op, "source_target_pairs", pairs)
    target = next((t for s, t in parsed if s == me), None)
    source = next((s for s, t in parsed if t == me), None)
    found = _routes[pairs] = Route(target, source)
    return found


_tag_ub: list[int] = []


def tag(channel_id: int) -> int:
    """MPI tag for a channel: the largest tags, counted down from MPI's upper bound.

    A program's own messages on ``COMM_WORLD`` use small tags (mpi4py's default is 0), and MPI
    matches a recv by source and tag: with tag = channel id, a program's ``Send`` of tag 0 before a
    transfer on channel 0 would swap the two payloads, silently. A private duplicate of the world
    would need a collective ``Dup`` on every rank, which ranks that compile different modules, or
    never transfer, would not all reach: a hang. Here the tags meet only where a program uses tags
    this high (MPICH: above 536,838,144) or receives with ``ANY_TAG``.
    """
    if not _tag_ub:  # MPI.TAG_UB is the attribute's key; its value is the largest tag
        MPI = mpi()
        _tag_ub.append(int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)))
    return _tag_ub[0] - int(channel_id)
