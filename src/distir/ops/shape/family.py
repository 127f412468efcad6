"""What the shape family's ops share: the family's name (their cost class in the simulator) and
their bytes read (a data-movement op reads what it writes)."""

from __future__ import annotations

from collections.abc import Sequence

from distir.ir.types import Type
from distir.ir.values import Attrs

FAMILY = "shape"


def copy_bytes(ins: Sequence[Type], outs: Sequence[Type], attrs: Attrs) -> float:
    """Data movement ops read what they write."""
    return float(sum(t.nbytes for t in outs))
