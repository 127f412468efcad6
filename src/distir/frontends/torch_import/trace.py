"""Tracing: an ``nn.Module`` and example inputs → a torch.export program with a symbolic batch.

``trace(module, inputs)`` exports ``module`` (non-strict torch.export, eval mode: dropout off)
with dim 0 of every tensor input a shared symbolic batch (``torch.export.Dim``), so no shape in
the program bakes the batch size in. Parameters may live on the meta device (``params_on_meta``
builds a module that way: nothing of the weights is allocated, a multi-billion-parameter model
traces in seconds); buffers keep their values (a rotary embedding's inverse frequencies), since
what is computed from them alone becomes a constant of the imported program.

``example inputs`` are a tuple of positional tensors or a dict of keyword arguments (non-tensor
values, e.g. ``use_cache=False``, are passed as they are); the first tensor is the model's first
input (token ids); every tensor's dim 0 is the batch.

Mixture-of-experts blocks are traced as leaves: one ``distir::moe`` call each (``moe``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from distir.frontends.torch_import.errors import TraceError
from distir.frontends.torch_import.moe import moe_leaves


@dataclass(frozen=True)
class Traced:
    """What ``trace`` produced: the exported program, the batch's symbol, the user inputs'
    placeholder names (in order) and, per parameter/buffer placeholder, its module path."""

    program: Any  # torch.export.ExportedProgram
    batch: Any  # the sympy symbol of the batch
    inputs: tuple[str, ...]
    params: Mapping[str, str]  # placeholder → fully qualified parameter name
    buffers: Mapping[str, Any]  # placeholder → the buffer's or constant's value (a torch tensor)


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Within this context, every parameter a module registers is created on the meta device
    (no storage); buffers stay where they are made (their values are needed)."""
    import torch.nn as nn

    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            cls = type(param)
            kwargs = param.__dict__
            param = cls(param.to("meta"), **kwargs)
            param.requires_grad = True
        original(self, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def _split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    return (inputs,), {}


def trace(module: Any, inputs: Any, name: str = "module") -> Traced:
    """Export ``module`` on ``inputs`` with a symbolic batch (module docstring); a failure is a
    ``TraceError`` with torch's first line."""
    import torch
    from torch.export import Dim

    args, kwargs = _split_inputs(inputs)
    batch = Dim("batch", min=2, max=1 << 24)

    def dyn(v: Any) -> Any:
        return {0: batch} if isinstance(v, torch.Tensor) else None

    if kwargs and args:
        raise TraceError(f"{name}: give the example inputs as a tuple or as a dict, not both")
    dynamic_shapes: Any = {k: dyn(v) for k, v in kwargs.items()} if kwargs else tuple(dyn(a) for a in args)
    module.eval()
    with moe_leaves(module), torch.no_grad():  # an unsupported MoE block: a StructureError
        program = _export(module, args, kwargs, dynamic_shapes, name)
    return _traced(program)


def _export(module: Any, args: Any, kwargs: dict[str, Any], dynamic_shapes: Any, name: str) -> Any:
    from torch.export import export

    try:
        return export(module, args, kwargs or None, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:  # torch raises many unrelated types; report its reason as one line
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise TraceError(f"cannot trace {name}: {type(e).__name__}: {first.strip()}") from None


def _traced(program: Any) -> Traced:
    from torch.export.graph_signature import InputKind

    sig = program.graph_signature
    params: dict[str, str] = {}
    buffers: dict[str, Any] = {}
    inputs: list[str] = []
    state = program.state_dict
    for spec in sig.input_specs:
        arg = spec.arg.name
        if spec.kind == InputKind.PARAMETER:
            params[arg] = spec.target
        elif spec.kind == InputKind.BUFFER:
            buffers[arg] = state[spec.target] if spec.target in state else program.constants[spec.target]
        elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            buffers[arg] = program.constants[spec.target]
        elif spec.kind == InputKind.USER_INPUT:
            inputs.append(arg)
    batch = None
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in inputs:
            val = node.meta.get("val")
            if val is not None and getattr(val, "ndim", 0) > 0:
                batch = val.shape[0].node.expr
                break
    return Traced(program, batch, tuple(inputs), params, buffers)
