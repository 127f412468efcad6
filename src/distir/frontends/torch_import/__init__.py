"""The PyTorch importer: an ``nn.Module`` and example inputs → a ``Model`` (the zoo's contract),
so the transforms, the search and the simulator treat it like a zoo model.

    from distir.frontends.torch_import import import_module
    model = import_module(module, (ids,), batch=8)          # a Model; model.module is DistIR

Roles: ``trace`` (torch.export with a symbolic batch, parameters on the meta device),
``aten_map`` (the ATen → registry op table), ``layers`` (layer functions by module path),
``convert`` (the graph → layer functions), ``placements`` (tensor-parallel placements by name
pattern), ``assemble`` (the chain and the loss), ``hf`` (Hugging Face configs) and ``source``
(model strings ``hf:PATH`` and ``package.module:factory``). torch (and transformers for
``hf:``) are imported only when a model is imported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from distir.frontends.torch_import.errors import (
    ImportFailure,
    SourceError,
    StructureError,
    TraceError,
    UnsupportedOpsError,
)
from distir.frontends.torch_import.placements import TP_PATTERNS, TPPattern
from distir.frontends.torch_import.stages import MultiUse, SplitError, StageSpec
from distir.frontends.zoo.model import Model
from distir.ir.types import DType


def import_module(
    module: Any,
    inputs: Any,
    batch: int,
    dtype: DType = DType.f32,
    name: str = "imported",
    tp_patterns: Sequence[TPPattern] = TP_PATTERNS,
    split: Sequence[str] = (),
    multi_use: MultiUse | Mapping[str, MultiUse] = "replicate",
) -> Model:
    """Trace ``module`` on ``inputs`` and build its ``Model`` for a global ``batch``.

    With ``pipe_split()`` markers in its ``forward`` or ``split`` module names the layers are
    pipeline stages (``stages``); ``multi_use`` says how a parameter used by several stages
    crosses them: ``"replicate"`` (default) or ``"transmit"``, or a mapping from parameter name
    to policy (the others replicate)."""
    from distir.frontends.torch_import.assemble import build_imported
    from distir.frontends.torch_import.convert import convert
    from distir.frontends.torch_import.trace import trace

    spec = (
        StageSpec(tuple(split), multi_use)
        if isinstance(multi_use, str)
        else StageSpec(tuple(split), "replicate", tuple(multi_use.items()))
    )
    conv = convert(trace(module, inputs, name), dtype, spec)
    return build_imported(conv, name, batch, dtype, tp_patterns=tp_patterns)


def pipe_split() -> None:
    """A pipeline stage boundary inside ``forward`` (PiPPy's ``pipe_split``; ``markers``)."""
    from distir.frontends.torch_import.markers import pipe_split as marker

    marker()


def weight_values(model: Model, module: Any) -> dict[str, Any]:
    """``model``'s weights' values from the torch ``module`` it was imported from."""
    from distir.frontends.torch_import.assemble import weight_values as values

    return values(model, module)


__all__ = [
    "TP_PATTERNS",
    "ImportFailure",
    "SourceError",
    "SplitError",
    "StageSpec",
    "StructureError",
    "TPPattern",
    "TraceError",
    "UnsupportedOpsError",
    "import_module",
    "pipe_split",
    "weight_values",
]
