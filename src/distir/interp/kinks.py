"""The reference executor with its piecewise decisions observed and, on request, reversed.

A piecewise op (``OpDef.kink``: Relu, ReluGrad, Max, Min, the ordered comparisons) takes, per
element, one branch or the other by the sign of a difference ``d = x - at``. When ``|d|`` is
within the rounding a finite-precision run makes of it, the run may decide otherwise than exact
arithmetic — and its outputs then truly differ from the exact ones (a ReLU unit flipped in
float32 changes a whole column of a weight update), though neither is wrong.

``KinkDomain`` runs a program like the reference executor (``distir.interp.reference``) and:

- records every *unit at a kink*: an element of a piecewise op's application whose ``|d|`` is
  at most ``bound(d)`` — ``tol × max(1, max |x|, max |at|)`` over the op's decision inputs, with
  ``tol`` the allowance the comparison of a run grants that precision
  (``distir.backend.verify.TOLERANCE``): a difference the comparison itself would accept as
  rounding. A unit is named by its op application's index in execution order (the same in
  every run of a program on inputs of the same shapes) and the element's flat index;
- decides the units listed in ``flips`` the other way: their ``x`` is mirrored about ``at``
  (``x' = 2·at − x``), which keeps ``|d|`` and reverses its sign.

Only elementwise decisions are covered: MaxPool's window maximum and MoE's top-k routing are
argmax-like choices among many, not listed here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import numpy as np

from distir.interp.loop import interpret
from distir.interp.reference import ReferenceDomain
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ops.registry import REGISTRY


class Unit(NamedTuple):
    """One element of one piecewise op application, at a kink within rounding."""

    application: int  # the op application's index in execution order
    element: int  # the element's flat index in the result (inputs broadcast to its shape)
    op: str  # the op's name
    distance: float  # |x - at| in exact arithmetic
    bound: float  # the rounding bound it is within


class KinkDomain(ReferenceDomain):
    """The reference executor's domain, recording units at a kink and reversing ``flips`` (a
    collection of (application, element)); see the module docstring."""

    def __init__(self, tol: float, flips: Collection[tuple[int, int]] = ()) -> None:
        super().__init__()
        self.tol = tol
        self.flips: dict[int, list[int]] = {}
        for a, i in flips:
            self.flips.setdefault(a, []).append(i)
        self.units: list[Unit] = []
        self.applications = 0

    def op(self, op: Op, args: Sequence[Any]) -> Sequence[Any]:
        k = self.applications
        self.applications += 1
        kink = REGISTRY[op.name].kink
        if kink is None:
            return super().op(op, args)
        x = np.asarray(args[kink.x])
        if not np.issubdtype(x.dtype, np.floating):
            return super().op(op, args)
        at = np.asarray(args[kink.at]) if kink.at is not None else np.zeros((), x.dtype)
        x_b, at_b = np.broadcast_arrays(x, at)
        d = x_b - at_b
        scale = max(1.0, float(np.max(np.abs(x_b), initial=0.0)), float(np.max(np.abs(at_b), initial=0.0)))
        bound = self.tol * scale
        near = np.flatnonzero(np.abs(d) <= bound)
        flat = np.abs(d).ravel()
        self.units += [Unit(k, int(i), op.name, float(flat[i]), bound) for i in near]
        flips = self.flips.get(k)
        if not flips:
            return super().op(op, args)
        mirrored = np.array(x_b, copy=True)
        idx = np.unravel_index(np.asarray(flips), mirrored.shape)
        mirrored[idx] = 2 * at_b[idx] - x_b[idx]
        new = list(args)
        new[kink.x] = mirrored.astype(x.dtype, copy=False)
        return super().op(op, new)


class KinkRun(NamedTuple):
    """A reference run's outputs and the units at a kink it met."""

    outputs: tuple[Any, ...]
    units: list[Unit]


def run_with_kinks(
    module: Module, args: Sequence[Any], tol: float, flips: Collection[tuple[int, int]] = ()
) -> KinkRun:
    """Run ``module``'s entry on ``args`` in the reference executor, recording the units at a
    kink within ``tol``'s bound and deciding ``flips`` the other way (module docstring)."""
    domain = KinkDomain(tol, flips)
    outs, _ = interpret(module, module.entry, list(args), domain)
    return KinkRun(outs, domain.units)
