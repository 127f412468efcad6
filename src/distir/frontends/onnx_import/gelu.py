"""GELU's tanh approximation written out in an ONNX graph, as the fused ``GeluTanh``.

An exporter writes Hugging Face's ``NewGELUActivation`` (GPT-2's ``gelu_new``) as its formula,
``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``: seven elementwise ops on scalar constants, whose
backward saves the cube's input, the tanh and both factors of the last product. A chain of that
shape becomes one ``GeluTanh(x)`` — ``F.gelu(x, approximate="tanh")``, one kernel each way,
saving its input — as the PyTorch importer's pattern does (``torch_import.patterns``). A chain
whose intermediate is read elsewhere, or whose constants differ, stays as written.
"""

from __future__ import annotations

from distir.frontends.onnx_import.chains import replace_matches, scalar, scalar_operand
from distir.frontends.onnx_import.values import Program
from distir.ir.ops import Op
from distir.ir.values import Value
from distir.ops._special import GELU_TANH_COEFF, GELU_TANH_ROOT

# the formula's other constants; float32 exporters round them all (0.044715 -> 0.044714998...)
HALF, CUBE, ONE = 0.5, 3.0, 1.0


def fuse_gelu_tanh(program: Program, outputs: tuple[Value, ...]) -> None:
    """Rewrite every matched chain of ``program`` in place (module docstring)."""
    made, uses = program.dataflow(outputs)
    found = {id(op): x for op in program.ops if (x := _gelu_input(program, op, made, uses)) is not None}

    def emit(op: Op, k: int, x: Value) -> None:
        program.emit("GeluTanh", (x,), {}, [op.outputs[0].name], k, f"node #{k} (gelu)", op.outputs)

    replace_matches(program, outputs, found, emit)


def _gelu_input(program: Program, last: Op, made: dict[Value, Op], uses: dict[Value, int]) -> Value | None:
    """x when ``last`` is the formula's final product, else None."""
    if last.name != "Mul" or len(last.inputs) != 2:
        return None
    for half, one in (last.inputs, last.inputs[::-1]):
        x = scalar_operand(program, half, "Mul", HALF, made, uses)
        t = scalar_operand(program, one, "Add", ONE, made, uses)
        if x is not None and t is not None and _tanh_of_inner(program, t, x, made, uses):
            return x
    return None


def _tanh_of_inner(
    program: Program, t: Value, x: Value, made: dict[Value, Op], uses: dict[Value, int]
) -> bool:
    """Whether ``t`` is ``tanh(√(2/π)·(x + 0.044715·x³))``, each step read once."""
    tanh = made.get(t)
    if tanh is None or tanh.name != "Tanh" or uses.get(t) != 1:
        return False
    inner = scalar_operand(program, tanh.inputs[0], "Mul", GELU_TANH_ROOT, made, uses)
    add = made.get(inner) if inner is not None else None
    if add is None or add.name != "Add" or x not in add.inputs:
        return False
    term = add.inputs[1] if add.inputs[0] is x else add.inputs[0]
    cube = scalar_operand(program, term, "Mul", GELU_TANH_COEFF, made, uses)
    p = made.get(cube) if cube is not None else None
    return p is not None and p.name == "Pow" and p.inputs[0] is x and scalar(program, p.inputs[1], CUBE)
