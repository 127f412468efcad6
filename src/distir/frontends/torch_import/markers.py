"""Pipeline split markers: ``distir.pipe_split()`` inside an ``nn.Module``'s ``forward`` (PiPPy's
``pipe_split``) marks a stage boundary.

It is the custom op ``distir::pipe_split`` (no inputs, no result), registered with
``torch.library`` on first use, so torch.export keeps it in the traced graph as a node of its
own (``is_marker``) and eager execution does nothing. torch is imported only when it is called.
"""

from __future__ import annotations

from typing import Any

OP_NAMESPACE, OP_NAME = "distir", "pipe_split"
_REGISTERED: list[Any] = []


def _op() -> Any:
    import torch

    if not _REGISTERED:

        def marker() -> None:
            return None

        op = torch.library.custom_op(f"{OP_NAMESPACE}::{OP_NAME}", marker, mutates_args=())
        op.register_fake(marker)
        _REGISTERED.append(op)
    return getattr(getattr(torch.ops, OP_NAMESPACE), OP_NAME)


def pipe_split() -> None:
    """Mark a pipeline stage boundary here (inside ``forward``; a no-op when run eagerly)."""
    _op()()


def is_marker(node: Any) -> bool:
    """Whether the FX ``node`` is a ``pipe_split`` marker."""
    target = getattr(node, "target", None)
    packet = getattr(target, "_overloadpacket", None)
    return node.op == "call_function" and str(packet) == f"{OP_NAMESPACE}.{OP_NAME}"
