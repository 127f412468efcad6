"""SiLU written out in an ONNX graph, as the fused ``Silu``.

An exporter writes ``F.silu(x)`` (the gate of Llama's and Mistral's SwiGLU MLP) as
``Mul(x, Sigmoid(x))``; torch runs it as one kernel each way, saving its input. A product of a
value and its own sigmoid, the sigmoid read by that product only, becomes one ``Silu(x)``, as the
PyTorch importer maps ``F.silu``.
"""

from __future__ import annotations

from distir.frontends.onnx_import.chains import replace_matches
from distir.frontends.onnx_import.values import Program
from distir.ir.ops import Op
from distir.ir.values import Value


def fuse_silu(program: Program, outputs: tuple[Value, ...]) -> None:
    """Rewrite every ``Mul(x, Sigmoid(x))`` of ``program`` in place (module docstring)."""
    made, uses = program.dataflow(outputs)
    found = {id(op): x for op in program.ops if (x := _silu_input(op, made, uses)) is not None}

    def emit(op: Op, k: int, x: Value) -> None:
        program.emit("Silu", (x,), {}, [op.outputs[0].name], k, f"node #{k} (silu)", op.outputs)

    replace_matches(program, outputs, found, emit)


def _silu_input(op: Op, made: dict[Value, Op], uses: dict[Value, int]) -> Value | None:
    """x when ``op`` is ``Mul(x, Sigmoid(x))`` (either order) and the sigmoid has no other reader."""
    if op.name != "Mul" or len(op.inputs) != 2:
        return None
    for x, s in (op.inputs, op.inputs[::-1]):
        sig = made.get(s)
        if sig is not None and sig.name == "Sigmoid" and sig.inputs[0] is x and uses.get(s) == 1:
            return x
    return None
