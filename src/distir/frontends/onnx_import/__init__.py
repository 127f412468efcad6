"""Import an ONNX model (``.onnx``) as a DistIR module.

    from distir.frontends.onnx_import import import_onnx
    imp = import_onnx("gpt2.onnx", dims={"batch": 8, "seq": 128})
    typed = distir.check(imp.module)                       # verifies; every shape resolves
    logits, = run_reference(typed, imp.arguments({"input_ids": ids}))

What becomes what:
- graph inputs → the entry's first parameters, in graph order; dynamic dims take their size from
  ``dims`` (by the dim's name), else ``batch`` for dim 0 (default 1), else it is an error;
- initializers → weights: entry parameters named after them (made valid identifiers), after the
  inputs, their values in ``OnnxImport.weights`` — but for integer tensors and float scalars
  (shapes, axes, constants), which become ``Constant`` ops;
- nodes → registry ops (``mapping``: opset attribute forms converted; shape subgraphs kept, with
  their values known so they resolve — the DistIR paper's Figure 4);
- module scopes of a PyTorch export → layer functions, one call per repeated block, when they
  form a chain (``assemble``); otherwise a single function (``OnnxImport.note`` says why).

The entry is ``@forward`` and returns the graph outputs (an inference program: an ONNX graph has
no loss). Errors are ``OnnxImportError`` (a ``ModelError``), one line each: a malformed file, an
unsupported op (all of them listed with counts and node names — never a partial import), a
dynamic dim without a size, a shape input only known at run time where distir needs it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distir.frontends.onnx_import.assemble import assemble, scopes_of, single
from distir.frontends.onnx_import.attention import CausalAt, fuse_attention
from distir.frontends.onnx_import.convert import convert
from distir.frontends.onnx_import.gelu import fuse_gelu_tanh
from distir.frontends.onnx_import.mapping import supported_ops
from distir.frontends.onnx_import.placements import weight_placements
from distir.frontends.onnx_import.reader import OnnxImportError, OnnxModel, read_model
from distir.frontends.onnx_import.rmsnorm import fuse_rms_norm
from distir.frontends.onnx_import.rope import fuse_rope
from distir.frontends.onnx_import.silu import fuse_silu
from distir.frontends.onnx_import.values import Param
from distir.ir.dtensor import Placement
from distir.ir.function import Function, Module
from distir.ir.ops import Call
from distir.ir.types import Device, DType

D0 = Device(0)


@dataclass(frozen=True, slots=True)
class OnnxImport:
    """An imported model: the module, its entry's parameters (graph inputs, then weights with
    their values), the graph's output names, the layer functions called in order (empty: one
    function), weights several layers use, why there are no layers, the model's opset and the
    chains fused with a causal mask, by graph node, with their windows (``attention.fuse_attention``)."""

    module: Module
    inputs: tuple[Param, ...]
    weights: tuple[Param, ...]
    outputs: tuple[str, ...]
    layers: tuple[str, ...]
    shared: tuple[str, ...]
    note: str
    opset: int
    causal: tuple[CausalAt, ...] = ()
    batch_dims: tuple[str, ...] = ()  # the names of the graph inputs' dynamic dim 0
    # the weights' tensor-parallel placements, by the modules using them (``placements``)
    tp: tuple[tuple[str, Placement], ...] = ()

    @property
    def num_params(self) -> int:
        """Elements of the weights (folded constants the exporter stored as initializers too)."""
        return sum(w.type.numel for w in self.weights)

    def op_counts(self) -> Counter[str]:
        """Ops by type as the program runs them (a layer function's ops once per call)."""
        counts: Counter[str] = Counter()

        def walk(fn: Function, times: int) -> None:
            for i in fn.body:
                if isinstance(i, Call):
                    walk(self.module[i.callee], times)
                else:
                    counts[i.name] += times

        walk(self.module.entry, 1)
        return counts

    def arguments(self, inputs: Mapping[str, Any]) -> list[np.ndarray]:
        """The entry's arguments: ``inputs`` (by ONNX input name) then the weights' values."""
        missing = [p.onnx_name for p in self.inputs if p.onnx_name not in inputs]
        if missing:
            raise OnnxImportError(f"no value given for graph input(s) {', '.join(missing)}")
        args = [np.asarray(inputs[p.onnx_name], dtype=p.type.dtype.to_numpy()) for p in self.inputs]
        return args + [w.value for w in self.weights if w.value is not None]


def import_onnx(
    source: str | Path | bytes | OnnxModel,
    *,
    dims: Mapping[str, int] | None = None,
    batch: int = 1,
    layers: bool = True,
    device: Device = D0,
    causal_at: Collection[CausalAt] = (),
    dtype: DType | None = None,
) -> OnnxImport:
    """Import an ONNX model from a path, its bytes or a model already read (``read_model``; it
    is not changed); see the module docstring. ``causal_at``: the ``causal`` nodes of an import
    of the same file at a smaller batch (``fuse_attention``). ``dtype``: the dtype the model
    computes in, every float the file declares taken as it (None: the file's own)."""
    model = source if isinstance(source, OnnxModel) else read_model(source)
    conv = convert(model, dims or {}, batch, device, dtype)
    fuse_rope(conv.program, conv.outputs)
    causal = fuse_attention(conv.program, conv.outputs, causal_at)
    fuse_gelu_tanh(conv.program, conv.outputs)
    fuse_rms_norm(conv.program, conv.outputs)
    fuse_silu(conv.program, conv.outputs)
    scopes = [scopes_of(n) for n in model.graph.node]
    tp = tuple(weight_placements(conv.program, scopes).items())
    if layers:
        lay = assemble(conv.program, conv.outputs, scopes)
        module, names, shared, note = lay.module, lay.layers, lay.shared, lay.note
    else:
        module, names, shared, note = Module((single(conv.program, conv.outputs),)), (), (), "layers=False"
    params = [p for _, p in conv.program.params]
    return OnnxImport(
        module=module,
        inputs=tuple(p for p in params if p.value is None),
        weights=tuple(p for p in params if p.value is not None),
        outputs=conv.output_names,
        layers=names,
        shared=shared,
        note=note,
        opset=model.opset,
        causal=causal,
        batch_dims=_batch_dims(model),
        tp=tp,
    )


def _batch_dims(model: Any) -> tuple[str, ...]:
    """The names of the graph inputs' dynamic dim 0 (the batch ``import_onnx`` sizes from
    ``batch`` unless ``dims`` names it)."""
    inits = {t.name for t in model.graph.initializer}
    names = []
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if vi.name not in inits and dims and dims[0].dim_param:
            names.append(dims[0].dim_param)
    return tuple(dict.fromkeys(names))


__all__ = ["OnnxImport", "OnnxImportError", "import_onnx", "supported_ops"]
