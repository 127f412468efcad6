"""RMSNorm written out in an ONNX graph, as the fused ``RMSNormalization``.

An exporter writes Hugging Face's ``LlamaRMSNorm`` (Llama, Mistral, Qwen2 and their kin) as its
formula, ``w · (x · 1/√(mean(x², last dim) + ε))``: ``Pow(x, 2)``, ``ReduceMean`` over the last
dim, ``Add`` of ε, ``Sqrt``, ``Reciprocal`` (or ``Div(1, ·)``), and two products. A chain of that
shape, each intermediate read once, becomes one ``RMSNormalization(x, w, epsilon=ε)`` — the
op the PyTorch importer and the zoo's Llama use, whose cost follows the trainer's kernels
(``--kernels``: one fused kernel, or eager PyTorch's separate ones). A chain whose intermediate
is read elsewhere, whose mean is over other dims or whose scale is not one vector stays as
written.
"""

from __future__ import annotations

from typing import NamedTuple

from distir.frontends.onnx_import.chains import replace_matches, scalar, scalar_operand
from distir.frontends.onnx_import.values import Program
from distir.ir.ops import Op
from distir.ir.values import Value


class _Norm(NamedTuple):
    x: Value
    scale: Value
    epsilon: float


def fuse_rms_norm(program: Program, outputs: tuple[Value, ...]) -> None:
    """Rewrite every matched chain of ``program`` in place (module docstring)."""
    made, uses = program.dataflow(outputs)
    found = {id(op): n for op in program.ops if (n := _norm(program, op, made, uses)) is not None}

    def emit(op: Op, k: int, n: _Norm) -> None:
        attrs = {"axis": -1, "epsilon": n.epsilon}
        where = f"node #{k} (rms norm)"
        program.emit("RMSNormalization", (n.x, n.scale), attrs, [op.outputs[0].name], k, where, op.outputs)

    replace_matches(program, outputs, found, emit)


def _norm(program: Program, last: Op, made: dict[Value, Op], uses: dict[Value, int]) -> _Norm | None:
    """(x, scale, ε) when ``last`` is the formula's final product ``scale · normed``, else None."""
    if last.name != "Mul" or len(last.inputs) != 2:
        return None
    for scale, normed in (last.inputs, last.inputs[::-1]):
        st = program.type(scale)
        mul = made.get(normed)
        if st.rank != 1 or mul is None or mul.name != "Mul" or len(mul.inputs) != 2 or uses.get(normed) != 1:
            continue
        for x, r in (mul.inputs, mul.inputs[::-1]):
            eps = _inverse_rms(program, r, x, made, uses)
            if eps is not None and program.type(x).shape[-1:] == st.shape and x is not scale:
                return _Norm(x, scale, eps)
    return None


def _inverse_rms(
    program: Program, r: Value, x: Value, made: dict[Value, Op], uses: dict[Value, int]
) -> float | None:
    """ε when ``r`` is ``1/√(mean(x², last dim) + ε)``, each step read once, else None."""
    inv = made.get(r)
    if inv is None or uses.get(r) != 1:
        return None
    if inv.name == "Reciprocal":
        s = inv.inputs[0]
    elif inv.name == "Div" and len(inv.inputs) == 2 and scalar(program, inv.inputs[0], 1.0):
        s = inv.inputs[1]
    else:
        return None
    sqrt = made.get(s)
    if sqrt is None or sqrt.name != "Sqrt" or uses.get(s) != 1:
        return None
    add = made.get(sqrt.inputs[0])
    if add is None or add.name != "Add" or len(add.inputs) != 2 or uses.get(sqrt.inputs[0]) != 1:
        return None
    mean, eps = _mean_and_epsilon(program, add)
    if mean is None:
        return None
    rm = made.get(mean)
    rank = program.type(x).rank
    if rm is None or rm.name != "ReduceMean" or uses.get(mean) != 1 or not rm.attrs.get("keepdims", 1):
        return None
    if rm.attrs.get("axes") not in ((-1,), (rank - 1,), [-1], [rank - 1]) or len(rm.inputs) != 1:
        return None
    square = scalar_operand(program, rm.inputs[0], "Pow", 2.0, made, uses)
    return eps if square is x else None


def _mean_and_epsilon(program: Program, add: Op) -> tuple[Value | None, float]:
    """The tensor operand of ``add`` and its scalar constant (ε), else (None, 0)."""
    for t, c in (add.inputs, add.inputs[::-1]):
        known = program.known(c)
        if program.known(t) is None and known is not None and known.size == 1:
            return t, float(known.reshape(()))
    return None, 0.0
