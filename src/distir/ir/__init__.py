"""The DistIR intermediate representation: types, values, ops, functions, modules, builder,
verifier, printer and parser. Depends on nothing but numpy."""

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Mesh, Partial, Placement, Replicate, Shard
from distir.ir.function import Function, Module, ModuleError
from distir.ir.ops import Call, Instr, Op
from distir.ir.parser import ParseError, parse_module, parse_type
from distir.ir.printer import print_function, print_module, print_op
from distir.ir.types import Device, DType, IRTypeError, ScalarType, TensorType, TupleType, Type
from distir.ir.values import Attrs, Value
from distir.ir.verify import OpSignatureError, VerifyError

__all__ = [
    "Attrs",
    "Call",
    "DTensorType",
    "DType",
    "Device",
    "Function",
    "FunctionBuilder",
    "IRTypeError",
    "Instr",
    "Mesh",
    "Module",
    "ModuleError",
    "Op",
    "OpSignatureError",
    "ParseError",
    "Partial",
    "Placement",
    "Replicate",
    "ScalarType",
    "Shard",
    "TensorType",
    "TupleType",
    "Type",
    "Value",
    "VerifyError",
    "parse_module",
    "parse_type",
    "print_function",
    "print_module",
    "print_op",
]
