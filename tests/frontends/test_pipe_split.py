"""Pipeline split points (PiPPy's semantics): ``distir.pipe_split()`` markers and ``split``
module names make the stage functions; a skip connection is forwarded through the middle stage; a
parameter used by two stages is replicated (tied) or transmitted; the pipelined training step
equals the sequential one."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import distir  # noqa: E402
from distir.frontends.torch_import import SplitError, import_module  # noqa: E402
from distir.frontends.zoo.model import ModelError, check_model  # noqa: E402
from distir.interp.lockstep import check_deadlock_free  # noqa: E402
from distir.interp.project import project  # noqa: E402
from distir.ir.printer import print_function  # noqa: E402
from distir.ir.types import DType  # noqa: E402
from distir.parallel.check import check_against_sequential  # noqa: E402
from distir.parallel.strategy import parse_strategy  # noqa: E402

D = 4
torch.set_num_threads(1)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(D, D)

    def forward(self, x: Any) -> Any:
        return self.lin(x)


class PiPPyExample(torch.nn.Module):
    """PiPPy's example: ``mm_param`` is used by stages 0 and 1, ``lin`` by stages 1 and 2, and
    ``skip`` goes from stage 0 to stage 2. ``markers=False``: the same program without markers
    (split by module name: the boundaries before ``first`` and ``last``)."""

    def __init__(self, markers: bool = True) -> None:
        super().__init__()
        self.markers = markers
        self.mm_param = torch.nn.Parameter(torch.randn(D, D))
        self.mm_param2 = torch.nn.Parameter(torch.randn(D, D))
        self.lin = torch.nn.Linear(D, D)
        self.first = Block()
        self.last = Block()

    def forward(self, x: Any) -> Any:
        x = torch.mm(x, self.mm_param)
        skip = x
        x = torch.relu(x)
        if self.markers:
            distir.pipe_split()
        x = self.first(torch.mm(x, self.mm_param))
        x = self.lin(x)
        if self.markers:
            distir.pipe_split()
        x = self.last(torch.relu(x)) + skip
        x = torch.mm(x, self.mm_param2)
        return self.lin(x)


def _import(multi_use: str = "replicate", batch: int = 8, dtype: DType = DType.f32, **kw: Any) -> Any:
    torch.manual_seed(0)
    module = PiPPyExample(**kw.pop("module_kw", {}))
    return import_module(module, (torch.randn(batch, D),), batch=batch, dtype=dtype, multi_use=multi_use, **kw)
