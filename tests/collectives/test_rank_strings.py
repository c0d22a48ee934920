"""What the compiler and the runtime share: the groups and pairs strings, the reductions, the type rule.

The runtime parses the strings with the compiler's decoder (:mod:`tvm_combiners.collectives.spec`)
and checks them against the job's ranks in its own words; the type rule runs on any IR through
:class:`~tvm_combiners.collectives.spec.OperandTypes`. No MPI job is started here.
"""

from __future__ import annotations

from typing import Any

import pytest

from tvm_combiners.collectives import spec as S
from tvm_combiners.collectives.runtime import comm, disco, host_collectives, native


@pytest.mark.parametrize("groups", [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0,),), ((3, 1, 0, 2),)])
def test_groups_decode_what_they_encode(groups: S.Groups) -> None:
    text = S.encode_groups(groups)
    assert S.decode_groups(text) == groups
    assert comm.parse_groups(text, "tvm_combiners.allreduce") == groups


def test_all_ranks_is_the_empty_string() -> None:
    assert S.encode_groups(None) == "" and S.decode_groups("") is None
    assert comm.parse_groups("", "tvm_combiners.allreduce") == ()  # the runtime's one group of all ranks
    assert S.decode_pairs("") == () == comm.parse_pairs("", "tvm_combiners.send")


@pytest.mark.parametrize("pairs", [((0, 1), (1, 0)), ((0, 1), (1, 2), (2, 0)), ((2, 0),)])
def test_pairs_decode_what_they_encode(pairs: S.Pairs) -> None:
    text = S.encode_pairs(pairs)
    assert S.decode_pairs(text) == pairs
    assert comm.parse_pairs(text, "tvm_combiners.send") == pairs  # in the string's order, not sorted


def test_a_pair_of_three_ranks_is_a_pair_error_naming_its_entry() -> None:
    with pytest.raises(S.PairError) as info:
        S.decode_pairs("0,1;1,2,0")
    assert info.value.entry == "1,2,0"
    with pytest.raises(ValueError) as info:
        S.decode_pairs("0,a")
    assert not isinstance(info.value, S.PairError)


@pytest.mark.parametrize("text, message", [
    ("0,a", "tvm_combiners.allreduce: malformed groups '0,a': expected integers separated by ','"),
    ("0,1;", "tvm_combiners.allreduce: malformed groups '0,1;': expected integers separated by ','"),
    ("0;1,0", "tvm_combiners.allreduce: groups '0;1,0' names rank 0 twice: every rank must be in exactly one group"),
    ("-1,0", "tvm_combiners.allreduce: groups '-1,0' names rank -1: ranks must be >= 0"),
])
def test_the_runtime_words_for_bad_groups(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        comm.parse_groups(text, "tvm_combiners.allreduce")
    assert str(info.value) == message


@pytest.mark.parametrize("text, message", [
    ("0,x", "malformed source_target_pairs '0,x': expected integers separated by ','"),
    ("0,1;1", "source_target_pairs '0,1;1' has '1': every pair needs 2 ranks (C1)"),
    ("0,1,2;x", "source_target_pairs '0,1,2;x' has '0,1,2': every pair needs 2 ranks (C1)"),  # the first bad entry
    ("x;0,1,2", "malformed source_target_pairs 'x;0,1,2': expected integers separated by ','"),
    ("0,1;0,2", "source_target_pairs '0,1;0,2' uses source 0 twice: sources must be unique (C2)"),
    ("0,1;2,1", "source_target_pairs '0,1;2,1' uses target 1 twice: targets must be unique (C3)"),
])
def test_the_runtime_words_for_bad_pairs(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        comm.parse_pairs(text, "tvm_combiners.send")
    assert str(info.value) == f"tvm_combiners.send: {message}"
    assert type(info.value) is ValueError  # what a rank reports, whatever the decoder raised


def test_the_compiler_reads_a_bad_pairs_attribute_as_not_in_its_encoding() -> None:
    attrs = {"source_target_pairs": "0,1,2", "channel_id": 0, "is_host_transfer": 0}
    with pytest.raises(S.CollectiveError, match=r"send: attribute source_target_pairs '0,1,2' is not in its encoding"):
        S.CollectiveSpec.from_attrs("send", attrs)


def test_the_reductions_are_one_list() -> None:
    assert host_collectives.REDUCTIONS is S.REDUCTIONS
    assert native.OPS is S.REDUCTIONS
    assert disco.REDUCTIONS is S.REDUCTIONS
    assert S.REDUCTIONS == ("sum", "prod", "min", "max", "avg")  # R.ccl's ReduceKind order: codes 0-4


# --------------------------------------------------------------------------- the type rule, on a toy IR


class _Tensor:
    def __init__(self, shape: tuple[Any, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype

    def __repr__(self) -> str:
        return f"T{self.shape}:{self.dtype}"


def _toy_types(seen: list[str]) -> S.OperandTypes:
    """Types of a toy IR: a _Tensor, a tuple of them, or anything else; ``seen`` logs each check."""

    def tensor(kind: str, what: str, ty: Any) -> tuple[tuple[Any, ...], str]:
        seen.append(f"tensor {what}")
        if not isinstance(ty, _Tensor):
            raise S.CollectiveError(f"{kind}: {what} is no toy tensor")
        return ty.shape, ty.dtype

    def token(kind: str, what: str, ty: Any) -> None:
        seen.append(f"token {what}")
        S.check_token(kind, what, ty.shape if isinstance(ty, _Tensor) else None, getattr(ty, "dtype", None))

    return S.OperandTypes(tensor, token, lambda ty: list(ty) if isinstance(ty, tuple) else None, repr)


TOKEN = _Tensor((), "int32")


def test_the_type_rule_of_every_op() -> None:
    seen: list[str] = []
    types = _toy_types(seen)
    x = _Tensor((4, "n"), "float32")
    assert S.infer_call_type(S.allreduce_spec("sum", None), [x], types) == ((4, "n"), "float32")
    assert S.infer_call_type(S.allgather_spec(0, 2, [[0, 1]]), [x], types) == ((8, "n"), "float32")
    assert S.infer_call_type(S.reduce_scatter_spec("max", 0, 2, [[0, 1]]), [x], types) == ((2, "n"), "float32")
    assert S.infer_call_type(S.send_spec([[0, 1]], 0, False), [x, TOKEN], types) == ((), "int32")
    assert S.infer_call_type(S.recv_spec([3], "int8", [[0, 1]], 0, False), [TOKEN], types) == ((3,), "int8")
    assert S.infer_call_type(S.CollectiveSpec("after_all"), [(TOKEN, TOKEN)], types) == ((), "int32")
    assert seen == ["tensor x"] * 4 + ["token token"] * 2 + ["token argument 0", "token argument 1"]


def test_the_type_rule_checks_in_argument_order() -> None:
    seen: list[str] = []
    types = _toy_types(seen)
    send = S.send_spec([[0, 1]], 0, False)
    with pytest.raises(S.CollectiveError, match="send: x has dtype bool, which is not supported"):
        S.infer_call_type(send, [_Tensor((2,), "bool"), None], types)  # the payload's dtype before the token
    assert seen == ["tensor x"]
    with pytest.raises(S.CollectiveError, match=r"send: token must be a token .*, got a non-tensor"):
        S.infer_call_type(send, [_Tensor((2,), "float32"), None], types)
    with pytest.raises(S.CollectiveError, match=r"after_all: its argument must be a tuple of tokens, got T\(\):int32"):
        S.infer_call_type(S.CollectiveSpec("after_all"), [TOKEN], types)
    with pytest.raises(S.CollectiveError, match="after_all: argument 1 must be a token"):
        S.infer_call_type(S.CollectiveSpec("after_all"), [(TOKEN, _Tensor((1,), "int32"))], types)
