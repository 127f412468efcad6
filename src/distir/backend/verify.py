"""Checking a real run against the reference executor.

``reference_outputs(prog)`` runs the global explicit program on the reference executor (numpy) with
the same inputs, upcast to float64 (so a real run is checked against exact arithmetic to float64's
precision, not against a second rounding of its own precision), and splits its results by the device
each lives on, as the per-rank programs return them. ``compare`` checks every rank's every output
(loss, updated weights, optimizer state, outputs) against it: a float output passes when ``max |real
- reference| <= tol * max(1, max |reference|)``, with ``tol`` that of the lowest precision the
program computes in (``TOLERANCE``: f64 1e-9, f32 1e-4, f16 1e-2, bf16 3e-2 — torch and numpy sum in
different orders, and low-precision kernels and collectives round differently from the reference's
round-after-each-op; an fp32 master weight updated from bf16 gradients carries bf16's error);
integers and booleans must be equal.

Kinks. A piecewise op (``OpDef.kink``: Relu and its gradient, Max, Min, the ordered comparisons)
whose decision input lies within rounding of its threshold can decide differently in the run than
in exact arithmetic, and the outputs then differ beyond any rounding allowance (a ReLU unit
flipped by float32 rounding changes a whole column of a weight update). ``verify`` therefore,
when the plain comparison fails, looks for an exact computation the run does agree with:
the reference executor re-run with some *units at a kink* — elements whose decision input is, in
exact arithmetic, within the comparison's own allowance of the threshold
(``distir.interp.kinks``) — decided the other way. It tries them one at a time, nearest to
their kink first (at most ``KINK_TRIALS``), keeps a reversal when it lowers the number of
elements outside the allowance, and stops when none is left outside. The run verifies only if
every output of every rank then passes the same comparison, nothing excluded; the verdict counts
the units reversed (``Verdict.kinks``) and the largest distance of one from its kink. A real
error is not a reversal of a unit at a kink, so it still fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from distir.interp.kinks import Unit, run_with_kinks
from distir.interp.project import outputs_by_rank
from distir.interp.reference import run_reference
from distir.ir.function import Module
from distir.ir.types import Device, DType, ScalarType, TensorType
from distir.report.summary import output_names

# float8: one step of its grid (a bf16 difference upstream may move a value across a rounding
# boundary: 2^-3 of E4M3's values, 2^-2 of E5M2's)
TOLERANCE: dict[DType, float] = {
    DType.f64: 1e-9,
    DType.f32: 1e-4,
    DType.f16: 1e-2,
    DType.bf16: 3e-2,
    DType.f8e4m3: 1.3e-1,
    DType.f8e5m2: 2.6e-1,
}
KINK_TRIALS = 64  # units at a kink tried, nearest first, when the plain comparison fails


class Verdict(NamedTuple):
    verified: bool
    max_abs_error: float  # over every output of every rank
    worst: str  # the output with the largest error relative to its tolerance, "d1: %name"
    checked: int  # outputs compared
    outside: int  # elements of the worst output outside its allowance (0 when verified)
    size: int  # elements of the worst output
    tolerance: float  # tol of the program's lowest precision (module docstring)
    kinks: int = 0  # units at a kink the run decided otherwise than exact arithmetic (docstring)
    kink_distance: float = 0.0  # the largest |decision input - threshold| of those, exact
    kink_bound: float = 0.0  # the rounding bound it is within


def reference_outputs(module: Module, args: Sequence[Any]) -> dict[Device, tuple[Any, ...]]:
    """The reference executor's outputs of ``module`` computed in float64 (every float input
    upcast; see the module docstring), by the device whose rank returns them."""
    return _by_rank(module, run_reference(module, [_f64(a) for a in args]))


def _by_rank(module: Module, outs: Sequence[Any]) -> dict[Device, tuple[Any, ...]]:
    return {d: tuple(outs[i] for i in idx) for d, idx in outputs_by_rank(module).items()}


def _f64(value: Any) -> Any:
    """``value`` with its float arrays (and scalars) in float64; others unchanged."""
    if isinstance(value, tuple):
        return tuple(_f64(v) for v in value)
    if isinstance(value, np.ndarray | np.generic) and np.issubdtype(value.dtype, np.floating):
        return np.asarray(value, dtype=np.float64)
    if isinstance(value, np.ndarray | np.generic) and value.dtype.kind == "V":  # bfloat16 and kin
        return np.asarray(value, dtype=np.float64)
    return value


def compute_dtype(module: Module) -> DType:
    """The lowest-precision float dtype among the values of ``module`` (f64 if none)."""
    found = {DType.f64}
    for fn in module.functions:
        for v in (*fn.params, *(o for i in fn.body for o in i.outputs)):
            if isinstance(v.type, TensorType | ScalarType) and v.type.dtype.is_float:
                found.add(v.type.dtype)
    return max(found, key=TOLERANCE.__getitem__)


class _Err(NamedTuple):
    abs: float  # max absolute error
    ratio: float  # that error over its allowance
    outside: int  # elements outside the allowance
    size: int


def _error(real: Any, ref: Any, dtype: DType | None, tol: float) -> _Err:
    """How far ``real`` is from ``ref`` (see the module docstring for the allowance)."""
    a = np.atleast_1d(np.asarray(real, dtype=np.float64))
    b = np.atleast_1d(np.asarray(ref, dtype=np.float64))
    if a.shape != b.shape:
        return _Err(float("inf"), float("inf"), b.size, b.size)
    if a.size == 0:
        return _Err(0.0, 0.0, 0, 0)
    diff = np.atleast_1d(np.abs(a - b))
    diff[np.isnan(a) & np.isnan(b)] = 0.0
    diff[np.isnan(diff)] = np.inf
    err = float(np.max(diff))
    if dtype is None or not dtype.is_float:
        return _Err(err, 0.0 if err == 0.0 else float("inf"), int(np.count_nonzero(diff)), b.size)
    finite = np.abs(b[np.isfinite(b)])
    allowed = tol * max(1.0, float(np.max(finite)) if finite.size else 1.0)
    return _Err(err, err / allowed, int(np.count_nonzero(diff > allowed)), b.size)


def _errors(
    module: Module, want: Mapping[Device, Sequence[Any]], got: Mapping[Device, Sequence[Any]], tol: float
) -> list[tuple[str, _Err]] | str:
    """Each output's error, named "d1: %name"; or why the outputs cannot be compared."""
    names = output_names(module.entry.outputs)
    idx = outputs_by_rank(module)
    out: list[tuple[str, _Err]] = []
    for d, ref in want.items():
        real = got.get(d, ())
        if len(real) != len(ref):
            return f"{d}: {len(real)} outputs, expected {len(ref)}"
        for k, (a, b) in enumerate(zip(real, ref, strict=True)):
            t = module.entry.outputs[idx[d][k]].type
            dtype = t.dtype if isinstance(t, TensorType | ScalarType) else None
            out.append((f"{d}: {names[idx[d][k]]}", _error(a, b, dtype, tol)))
    return out


def compare(
    module: Module, want: Mapping[Device, Sequence[Any]], got: Mapping[Device, Sequence[Any]]
) -> Verdict:
    """Every rank's outputs against the reference's (see the module docstring)."""
    tol = TOLERANCE[compute_dtype(module)]
    errs = _errors(module, want, got, tol)
    if isinstance(errs, str):
        return Verdict(False, float("inf"), errs, 0, 0, 0, tol)
    worst_abs, worst_ratio, worst, outside, size = 0.0, -1.0, "", 0, 0
    for name, e in errs:
        worst_abs = max(worst_abs, e.abs)
        if e.ratio > worst_ratio:
            worst_ratio, worst, outside, size = e.ratio, name, e.outside, e.size
    return Verdict(worst_ratio <= 1.0, worst_abs, worst, len(errs), outside, size, tol)


def _outside(
    module: Module, want: Mapping[Device, Sequence[Any]], got: Mapping[Device, Sequence[Any]]
) -> float:
    """Elements outside their allowance over every output (infinite when not comparable)."""
    errs = _errors(module, want, got, TOLERANCE[compute_dtype(module)])
    return float("inf") if isinstance(errs, str) else float(sum(e.outside for _, e in errs))


def verify(module: Module, args: Sequence[Any], got: Mapping[Device, Sequence[Any]]) -> Verdict:
    """``got`` (each rank's outputs) against the reference on ``args``, kink-aware (module
    docstring): the plain comparison; if it fails, the comparison with units at a kink reversed
    one by one, nearest first, when that passes; else the plain comparison's failure."""
    tol = TOLERANCE[compute_dtype(module)]
    args64 = [_f64(a) for a in args]
    exact = run_with_kinks(module, args64, tol)
    want = _by_rank(module, exact.outputs)
    plain = compare(module, want, got)
    if plain.verified or not exact.units:
        return plain
    best = _outside(module, want, got)
    if best == float("inf"):  # outputs missing or misshapen: no reversal explains that
        return plain
    kept: list[Unit] = []
    for u in sorted(exact.units, key=lambda u: u.distance / u.bound)[:KINK_TRIALS]:
        trial = [*kept, u]
        w = _by_rank(
            module, run_with_kinks(module, args64, tol, [(k.application, k.element) for k in trial]).outputs
        )
        n = _outside(module, w, got)
        if n < best:
            best, kept, want = n, trial, w
        if best == 0:
            break
    v = compare(module, want, got)
    if not kept or not v.verified:
        return plain
    far = max(kept, key=lambda u: u.distance)
    return v._replace(kinks=len(kept), kink_distance=far.distance, kink_bound=far.bound)
