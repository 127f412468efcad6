"""Model factories for the Automap tests (``--model tests.search.automap_models:NAME``): torch
modules whose weight names match none of the importer's tensor-parallel patterns, so the
imported model declares no placements (torch is imported only when a factory runs)."""

from __future__ import annotations

from typing import Any


def wide_mlp() -> tuple[Any, Any]:
    """An input projection, two residual blocks ``x + narrow(gelu(widen(x)))`` of width 1024
    (4× inside), a classifier of 1024 classes."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.widen = torch.nn.Linear(width, 4 * width)
            self.narrow = torch.nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.narrow(torch.nn.functional.gelu(self.widen(x)))

    class WideMLP(torch.nn.Module):
        def __init__(self, width: int = 1024, blocks: int = 2) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(width, width)
            self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))
            self.classify = torch.nn.Linear(width, width, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            for block in self.blocks:
                h = block(h)
            return self.classify(h)

    torch.manual_seed(0)
    return WideMLP(), (torch.zeros(2, 1024),)
