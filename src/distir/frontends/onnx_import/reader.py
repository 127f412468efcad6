"""Reading and validating an ``.onnx`` file: the model proto, its opset, its dtypes, and the one
check made before anything is converted — every node's op is supported — so an import is
never partial.

Errors are ``OnnxImportError`` (a ``ModelError``: the CLI prints it as one line): a file that
cannot be read or is not an ONNX model, a model the ONNX checker rejects, an opset older than
the importer knows, a dtype distir has no counterpart for, and unsupported ops — all of them at
once, each with its count and the names of its nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distir.frontends.zoo.model import ModelError
from distir.ir.types import DType

MIN_OPSET = 7  # the oldest default-domain opset whose attribute forms the mapping converts
_SHOW_NODES = 3  # node names listed per unsupported op


class OnnxImportError(ModelError):
    """An ONNX model cannot be imported; the message (one line) names the cause and where."""


def require_onnx() -> Any:
    """The ``onnx`` package, or a one-line error saying how to get it."""
    try:
        import onnx
    except ImportError:  # pragma: no cover - the extra is installed for the tests
        raise OnnxImportError("importing ONNX needs the onnx package: pip install 'distir[onnx]'") from None
    return onnx


@dataclass(frozen=True, slots=True)
class OnnxModel:
    """A checked model: its graph (local functions inlined) and the default domain's opset."""

    proto: Any  # onnx.ModelProto
    opset: int
    where: str  # the file name (or "<bytes>") for messages

    @property
    def graph(self) -> Any:
        return self.proto.graph


def read_model(source: str | Path | bytes) -> OnnxModel:
    """Load and check an ONNX model from a path or its serialized bytes."""
    onnx = require_onnx()
    where = "<bytes>" if isinstance(source, bytes) else str(source)
    if not isinstance(source, bytes):
        _check_readable(Path(source))
    try:
        # a path: weights stored as external data beside the file are loaded too
        proto = onnx.load_model_from_string(source) if isinstance(source, bytes) else onnx.load(str(source))
    except Exception as e:  # protobuf raises DecodeError and friends; no common base class
        raise OnnxImportError(f"{where}: not an ONNX model ({_one_line(e)})") from None
    if not proto.HasField("graph") or not proto.graph.node:
        raise OnnxImportError(f"{where}: not an ONNX model (no graph nodes)")
    try:
        # a path is checked from the file: a model over protobuf's 2 GB limit is checked there too
        onnx.checker.check_model(proto if isinstance(source, bytes) else str(source))
    except onnx.checker.ValidationError as e:
        raise OnnxImportError(f"{where}: invalid ONNX model: {_one_line(e)}") from None
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise OnnxImportError(f"{where}: opset {opset} is older than the oldest supported ({MIN_OPSET})")
    return OnnxModel(proto, opset, where)


def _check_readable(path: Path) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as e:
        raise OnnxImportError(f"{path}: cannot read the file ({e.strerror or e})") from None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] or type(e).__name__


def check_supported(model: OnnxModel, supported: Collection[str]) -> None:
    """Raise listing every unsupported op (count and node names) unless all are supported."""
    counts: Counter[str] = Counter()
    names: dict[str, list[str]] = {}
    for k, node in enumerate(model.graph.node):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if key not in supported:
            counts[key] += 1
            names.setdefault(key, []).append(node.name or f"#{k}")
    if not counts:
        return
    parts = []
    for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        shown = ", ".join(names[op][:_SHOW_NODES]) + (", ..." if n > _SHOW_NODES else "")
        parts.append(f"{op} ×{n} ({shown})")
    total = sum(counts.values())
    raise OnnxImportError(
        f"{model.where}: {total} node(s) use ops distir does not support: {'; '.join(parts)}"
    )


# ONNX TensorProto.DataType -> distir dtype (bf16 computes in f32 in the reference)
_DTYPES = {
    1: DType.f32,
    3: DType.i8,
    6: DType.i32,
    7: DType.i64,
    9: DType.bool,
    10: DType.f16,
    11: DType.f64,
    16: DType.bf16,
}


def dtype_of(elem_type: int, what: str) -> DType:
    """The distir dtype of an ONNX element type; unsupported ones name ``what``."""
    dt = _DTYPES.get(elem_type)
    if dt is None:
        onnx = require_onnx()
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
        raise OnnxImportError(f"{what}: element type {name} has no distir dtype")
    return dt
