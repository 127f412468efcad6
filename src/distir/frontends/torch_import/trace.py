"""Tracing: an ``nn.Module`` and example inputs → a torch.export program with a symbolic batch.

``trace(module, inputs)`` exports ``module`` (non-strict torch.export, eval mode: dropout off)
with dim 0 of every tensor input a shared symbolic batch (``torch.export.Dim``), so no shape in
the program bakes the batch size in. Parameters may live on the meta device (``params_on_meta``
builds a module that way: nothing of the weights is allocated, a multi-billion-parameter model
traces in seconds); buffers keep their values (a rotary embedding's inverse frequencies), since
what is computed from them alone becomes a constant of the imported program. While the module
is exported, a tensor on the meta device (parameter, buffer or example input) stands in as a
fake CPU tensor (``_meta_params_on_cpu``): the activations share the buffers' device, and what the
forward makes on theirs has values.

``example inputs`` are a tuple of positional tensors or a dict of keyword arguments (non-tensor
values, e.g. ``use_cache=False``, are passed as they are); the first tensor is the model's first
input (token ids); every tensor's dim 0 is the batch.

Mixture-of-experts blocks are traced as leaves: one ``distir::moe`` call each (``moe``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping
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
    # an unsupported MoE block: a StructureError
    with moe_leaves(module), torch.no_grad(), _meta_params_on_cpu(module) as on_cpu:
        args = tuple(on_cpu(a) for a in args)
        kwargs = {k: on_cpu(v) for k, v in kwargs.items()}
        program = _export(module, args, kwargs, dynamic_shapes, name)
    return _traced(program)


@contextlib.contextmanager
def _meta_params_on_cpu(module: Any) -> Iterator[Callable[[Any], Any]]:
    """While the module is traced, each parameter on the meta device is a fake tensor on the
    CPU (no storage either): the activations are then on the CPU with the inputs and the
    buffers, so a tensor the forward makes on the activations' device (an index list, Falcon's
    ``qkv[..., [-2], :]``) is a constant with values, and a CPU buffer read without a ``.to``
    (GPT-J's sinusoidal table) meets activations on its own device. Yields the function that
    makes an example input on the meta device such a fake tensor too."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def on_cpu(t: Any) -> Any:
        meta = isinstance(t, torch.Tensor) and t.device.type == "meta"
        return FakeTensor(mode, t, torch.device("cpu")) if meta else t

    swapped: list[tuple[dict[str, Any], str, Any]] = []
    fakes: dict[int, Any] = {}  # a parameter shared by modules (a tied weight) stays one
    for mod in module.modules():
        # a buffer on meta too: it has no values, which the import of a constant says (``convert``)
        for table in (mod._parameters, mod._buffers):
            for key, p in list(table.items()):
                if p is not None and p.device.type == "meta":
                    if id(p) not in fakes:
                        fake = FakeTensor(mode, p.data, torch.device("cpu"))
                        fakes[id(p)] = (
                            torch.nn.Parameter(fake, requires_grad=p.requires_grad)
                            if isinstance(p, torch.nn.Parameter)
                            else fake
                        )
                    swapped.append((table, key, p))
                    table[key] = fakes[id(p)]
    try:
        yield on_cpu
    finally:
        for table, key, p in swapped:
            table[key] = p


# where torch.export says the user's code raised ("The following call raised this error:")
_CALL_SITE = re.compile(
    r"following call raised this error:\s*\n"
    r'\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in \S+\n\s*(?P<code>[^\n]*)'
)


@contextlib.contextmanager
def _torch_quiet() -> Iterator[io.StringIO]:
    """torch.export's own reports while it runs: what it prints on stderr (the partial graph of
    a failed trace) into the yielded buffer, and its loggers' warnings ("Unable to find user code
    corresponding to ...") held back: a failure is then one line (``TraceError``)."""
    torch_log = logging.getLogger("torch")
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            yield buf
    finally:
        torch_log.setLevel(level)


def _check_batch(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> None:
    """Every example tensor has a dim 0 of at least 2: torch.export specializes a dim of size 1
    (and a 0-d tensor has no batch dim), so the batch could not trace as a symbol."""
    import torch

    named = [(f"input {i}", a) for i, a in enumerate(args)] + [(f"input {k!r}", v) for k, v in kwargs.items()]
    for what, v in named:
        if isinstance(v, torch.Tensor) and (v.dim() == 0 or v.shape[0] < 2):
            got = "is 0-d" if v.dim() == 0 else f"has dim 0 (the batch) of {v.shape[0]}"
            raise TraceError(
                f"{name}: example {what} {got}; give every example tensor a batch of at least 2 as "
                "dim 0, so the batch traces as a symbolic dim"
            )


def _export(module: Any, args: Any, kwargs: dict[str, Any], dynamic_shapes: Any, name: str) -> Any:
    from torch.export import export

    _check_batch(tuple(args), kwargs, name)
    try:
        with _torch_quiet() as said:
            program = export(module, args, kwargs or None, dynamic_shapes=dynamic_shapes, strict=False)
    except (Exception, SystemExit) as e:  # torch raises many unrelated types (the model may exit)
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        where = _CALL_SITE.search(str(e))
        at = f" (at {where.group('file')}:{where.group('line')}: {where.group('code')})" if where else ""
        raise TraceError(f"cannot trace {name}: {type(e).__name__}: {first.strip()}{at}") from None
    sys.stderr.write(said.getvalue())  # a successful trace's prints, as torch made them
    return program


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
