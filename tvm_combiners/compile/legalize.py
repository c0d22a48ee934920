"""Legalizations that replace TVM's where its lowering is slow on a CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax
from tvm.target import Target


def _in_float32(op: str, approximate: Callable[[Any], Any]) -> Callable[[relax.BlockBuilder, relax.Call], relax.Expr]:
    """A legalization of elementwise ``relax.<op>`` as ``approximate`` (a TE function of a float32
    tensor): float16 computes in float32, as TVM's does; other dtypes keep TVM's legalization."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        from tvm import topi

        dtype = call.ty.dtype  # these ops keep their input's dtype
        if dtype not in ("float32", "float16"):
            return tvm.ir.Op.get(f"relax.{op}").get_attr("FLegalize")(bb, call)

        def te(x: Any) -> Any:
            y = approximate(x if dtype == "float32" else topi.cast(x, "float32"))
            return y if dtype == "float32" else topi.cast(y, dtype)

        return bb.call_te(te, call.args[0], primfunc_name_hint=op)  # the name fused functions take

    return legalize


def _fast_erf(x: Any) -> Any:
    from tvm import topi

    return topi.fast_erf(x)


def _fast_sigmoid(x: Any) -> Any:
    from tvm import topi

    one = tvm.tirx.const(1.0, "float32")
    sigmoid = topi.divide(one, topi.add(one, topi.fast_exp(topi.negative(x))))
    return topi.where(topi.isnan(x), x, sigmoid)  # fast_exp clamps its input, which would turn NaN into a number


#: erf as TOPI's vectorizable rational approximation where TVM's legalization calls libm's erff once
#: per element: BERT's GELU on llvm. 590k elements (MiniLM-L3's three FFNs) take 7.6 ms that way,
#: 0.28 ms this way, with |error| under 3e-7 against the exact erf (libm's: 5e-8); onnxruntime's CPU
#: kernel approximates erf too.
fast_erf = _in_float32("erf", _fast_erf)
#: sigmoid as ``1 / (1 + fast_exp(-x))`` (TOPI's vectorizable exp) where TVM's calls libm's expf once
#: per element: SiLU after every convolution of EfficientNet-B0 and YOLOv8n. Relative error under
#: 3e-7 where sigmoid exceeds 1e-30 (fast_exp clamps its input at 88.4: below x = -88 the result stays
#: near 4e-39 where the exact value is smaller still); NaN stays NaN.
fast_sigmoid = _in_float32("sigmoid", _fast_sigmoid)


def fast_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """softmax as ``e / sum(e)``, ``e = fast_exp(x - max(x))`` (TOPI's vectorizable exp) where TVM's
    calls libm's expf once per element: a transformer's attention. MiniLM-L3's three (12 x 128 x 128
    each) took 2.24 of its ~15 ms that way. ``x - max(x)`` is at most 0, where fast_exp's relative
    error is under 3e-7; a row holding NaN stays NaN; float16 computes in float32."""
    from tvm import topi

    dtype, axis = call.ty.dtype, int(call.attrs.axis)
    if dtype not in ("float32", "float16"):
        return tvm.ir.Op.get("relax.nn.softmax").get_attr("FLegalize")(bb, call)

    def te(x: Any) -> Any:
        x32 = x if dtype == "float32" else topi.cast(x, "float32")
        shifted = topi.subtract(x32, topi.max(x32, axis=axis, keepdims=True))
        e = topi.where(topi.isnan(shifted), shifted, topi.fast_exp(shifted))  # fast_exp clamps NaN to a number
        y = topi.divide(e, topi.sum(e, axis=axis, keepdims=True))
        return y if dtype == "float32" else topi.cast(y, dtype)

    return bb.call_te(te, call.args[0], primfunc_name_hint="softmax")


def legalizations(target: Target) -> dict[str, Any] | None:
    """LegalizeOps' overrides for ``target``: erf, sigmoid and softmax on llvm (cuda's exp and erf
    are fast device intrinsics already)."""
    if target.kind.name != "llvm":
        return None
    return {"relax.erf": fast_erf, "relax.sigmoid": fast_sigmoid, "relax.nn.softmax": fast_softmax}
