"""Model factories for ``--model package.module:factory`` tests: each returns an ``nn.Module``
and its example inputs (torch is imported only when a factory runs)."""

from __future__ import annotations

from typing import Any


def mlp() -> tuple[Any, Any]:
    import torch
    from tests.frontends.test_torch_import_numeric import MLP

    return MLP(), (torch.zeros(2, 5),)


def unsupported() -> tuple[Any, Any]:
    """Uses two ops the importer has no mapping for: cumsum (twice) and erf."""
    import torch

    class Odd(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.cumsum(-1) + torch.erf(x)
            return self.fc(y.cumsum(-1))

    return Odd(), (torch.zeros(2, 4),)


def data_dependent() -> tuple[Any, Any]:
    """Python control flow on a tensor's value: torch.export cannot trace it."""
    import torch

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                return self.fc(x)
            return self.fc(-x)

    return Branchy(), (torch.zeros(2, 4),)


def not_a_module() -> tuple[Any, Any]:
    return "a string", ()


def conv() -> tuple[Any, Any]:
    """An nn.Conv1d (no mapping): its op is made in torch's conv.py, called from here."""
    import torch

    class Conv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    return Conv(), (torch.zeros(2, 4, 6),)


def with_mask() -> tuple[Any, Any]:
    """A forward taking keyword arguments, the second (a mask) used by the model."""
    import torch

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(8, 4)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.emb(input_ids) * attention_mask.unsqueeze(-1)

    return Masked(), {"input_ids": torch.zeros(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 3)}


def batch_of_one() -> tuple[Any, Any]:
    import torch

    return torch.nn.Linear(4, 4), (torch.zeros(1, 4),)


def raises() -> tuple[Any, Any]:
    raise RuntimeError("no checkpoint at /data/ckpt")


def pippy_example() -> tuple[Any, Any]:
    """PiPPy's example without markers (``test_pipe_split``): split it by module name."""
    import torch
    from tests.frontends.test_pipe_split import PiPPyExample

    torch.manual_seed(0)
    return PiPPyExample(markers=False), (torch.zeros(2, 4),)


def big_table() -> tuple[Any, Any]:
    """Multiplies by a table computed from a buffer: a constant of 1,024 × 1,025 elements, one
    row more than the importer writes into a program as a literal."""
    import torch

    class Table(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("angles", torch.arange(1024 * 1025, dtype=torch.float32).reshape(1024, 1025))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.angles.sin()

    return Table(), (torch.zeros(2, 1024),)


def on_meta() -> tuple[Any, Any]:
    """A model built on the meta device, as a large one would be: no storage anywhere."""
    import torch

    with torch.device("meta"):
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)), (
            torch.zeros(2, 5),
        )


def buffer_on_meta() -> tuple[Any, Any]:
    """Built on the meta device with a buffer, whose values the import needs."""
    import torch

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x * self.scale)

    with torch.device("meta"):
        return Scaled(), (torch.zeros(2, 4),)
