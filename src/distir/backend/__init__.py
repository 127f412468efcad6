"""Running DistIR programs for real: per-rank programs on torch (``torch.distributed``).

torch is an optional extra (``pip install distir[torch]``): nothing here imports it at module
import time, so the core stays importable with numpy alone. ``require_torch()`` imports it or
raises ``TorchMissing`` with the install command.
"""

from __future__ import annotations

from typing import Any


class TorchMissing(RuntimeError):
    """torch is not installed; the message says how to install it."""


def require_torch() -> Any:
    """The ``torch`` module, or ``TorchMissing`` naming the extra to install."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the test environment has torch
        raise TorchMissing(
            "this needs PyTorch: pip install -c constraints.txt 'distir[torch]' (torch==2.13.0)"
        ) from e
    return torch
