"""What an op's torch implementation sees: ``TorchContext``.

An ``OpDef``'s ``torch`` slot holds ``impl(ctx, inputs, attrs) -> outputs``: ``inputs`` are torch
tensors (0-d tensors for scalars, Python tuples for tuples), ``attrs`` the op's attributes as in
the IR, and ``ctx`` this context: the ``torch`` module itself (so op families never import torch
at module level), the torch device tensors live on, and, for rank ops, the process-group layer
(this process's device in the program, the global rank of any program device, the process group
of a device group, and the point-to-point operations posted and not yet started: ``post`` and
``flush``). A single-process context (``TorchContext.local()``) has no process groups; rank ops
refuse to run there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from distir.backend import require_torch
from distir.ir.types import Device, DType


class NoProcessGroup(RuntimeError):
    """A rank op ran without torch.distributed set up (a single-process context)."""


@dataclass(slots=True, eq=False)
class TorchContext:
    """See the module docstring. ``me``: this process's program device (None: single process);
    ``ranks``: program device -> global torch.distributed rank; ``new_group``: makes a process
    group of global ranks (``torch.distributed.new_group``; every rank must ask for every group
    in the same order, so groups are made up front by the launcher and looked up here)."""

    torch: Any
    device: Any  # a torch.device
    me: Device | None = None
    ranks: dict[Device, int] = field(default_factory=dict)
    groups: dict[tuple[int, ...], Any] = field(default_factory=dict)
    new_group: Callable[[Sequence[int]], Any] | None = None
    # point-to-point operations posted by rank.Send/rank.Recv and not yet waited for (``post``)
    pending: list[Any] = field(default_factory=list)

    @staticmethod
    def local(device: str = "cpu") -> TorchContext:
        torch = require_torch()
        return TorchContext(torch, torch.device(device))

    @property
    def dist(self) -> Any:
        """``torch.distributed``; raises ``NoProcessGroup`` in a single-process context."""
        if self.me is None:
            raise NoProcessGroup("rank ops need torch.distributed: run per-rank programs with `distir run`")
        return self.torch.distributed

    def rank(self, d: Device) -> int:
        """The global rank running program device ``d``."""
        try:
            return self.ranks[d]
        except KeyError:
            raise NoProcessGroup(f"device {d} has no rank in this run") from None

    def group(self, devices: Sequence[Device]) -> Any:
        """The process group of ``devices`` (in the group's order), made on first use."""
        key = tuple(sorted(self.rank(d) for d in devices))
        g = self.groups.get(key)
        if g is None:
            if self.new_group is None:
                raise NoProcessGroup(f"no process group for ranks {key}")
            g = self.groups[key] = self.new_group(key)
        return g

    def post(self, p2p: Any) -> None:
        """Post a ``torch.distributed.P2POp``; it starts at the next ``flush`` with the others
        posted since the last one (one ``batch_isend_irecv``), so a rank's consecutive sends and
        receives overlap. The runner flushes before anything reads a received tensor."""
        self.pending.append(p2p)

    def flush(self) -> None:
        """Start every posted point-to-point operation together and wait for all of them."""
        if not self.pending:
            return
        ops, self.pending = self.pending, []
        for req in self.dist.batch_isend_irecv(ops):
            req.wait()

    def dtype(self, dt: DType) -> Any:
        """The torch dtype of a DistIR dtype."""
        return getattr(self.torch, _TORCH_DTYPES[dt.name])


_TORCH_DTYPES = {
    "f16": "float16",
    "bf16": "bfloat16",
    # float8 values are held as the values they stand for (``distir.ops.float8``): in bf16
    "f8e4m3": "bfloat16",
    "f8e5m2": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "bool": "bool",
}
