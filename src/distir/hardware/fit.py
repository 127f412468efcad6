"""Fitting the cost model to measured times (``distir calibrate``'s second half; numpy only).

Three fits, each a pure function of measurements, each in the cost model's own terms so that a
simulation with the fitted figures reproduces the measured times:

- ``fit_gemm``: matrix products of known shapes and FLOPs. The time model is
  ``launch + FLOPs / (peak × shape_factor(shape, sms))`` (``distir.hardware.gemm`` with its
  ceiling at 1): per dtype the asymptotic rate ``peak`` is the geometric mean of
  ``rate / shape_factor`` weighted by each product's FLOPs (a weighted least-squares fit in log
  space: the products that do the work decide, as they decide a step's time; weights from the
  work, not the measured time, so that a sample slowed by another process does not weigh
  more), and ``sms`` the candidate with the smallest weighted log residual over all dtypes.
  The device's peak for a dtype is that asymptote, and the ``GemmProfile`` passes through the
  largest measured shape (its ``anchor``) at the shape factor there, so the curve the cost
  model draws is the fitted one.
- ``fit_family``: the ops of one family (elementwise, nn, attention, ...), each with its FLOPs
  and bytes as the registry counts them. The time model is the roofline
  ``launch + max(FLOPs / (peak × flop), bytes / (bandwidth × memory))`` with ``peak`` and
  ``bandwidth`` the device's; ``flop`` and ``memory`` are found by a grid search in log space
  (refined once) minimising the squared relative error, ``launch`` in closed form at each grid
  point (weighted least squares, clamped at 0). An efficiency the data do not bound (every op of
  the family limited by the other resource) comes out as 1 and is flagged ``bounded=False``.
- ``fit_link``: a collective's (or a point-to-point send's) times over message sizes and group
  sizes. Its alpha-beta formula in ``distir.sim.collectives`` is linear in 1/B and α, so the
  formula's own coefficients (the time on a probe node with B = 1 B/s, α = 0, and with B = ∞,
  α = 1 s) turn the fit into a non-negative least squares in two unknowns (squared relative
  error).

Each fit reports its median and max relative error over its samples (``rel_err``): the figure
that says how well the cost model's form describes this machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from distir.hardware.cluster import Cluster
from distir.hardware.gemm import GemmShape, shape_factor
from distir.hardware.specs import DeviceSpec, GemmProfile, LinkSpec, NodeSpec


class FitError(ValueError):
    """Too few or unusable measurements for a fit (names the fit and what is missing)."""


class GemmSample(NamedTuple):
    """One timed matrix product: its shape, dtype name (``f32``, ``bf16``...), FLOPs, seconds."""

    shape: GemmShape
    dtype: str
    flops: float
    seconds: float


class OpSample(NamedTuple):
    """One timed op: its op name, family, dtype name, FLOPs, bytes moved and seconds."""

    op: str
    family: str
    dtype: str
    flops: float
    nbytes: float
    seconds: float


class LinkSample(NamedTuple):
    """One timed collective (or p2p send): group size, bytes (as the cost function reads them)
    and seconds."""

    collective: str
    group: int
    nbytes: float
    seconds: float


class Quality(NamedTuple):
    """Median and max relative error of a fit over its samples, and their number."""

    median: float
    max: float
    samples: int


def _quality(model: np.ndarray, measured: np.ndarray) -> Quality:
    rel = np.abs(model - measured) / measured
    return Quality(float(np.median(rel)), float(np.max(rel)), int(rel.size))


class GemmFit(NamedTuple):
    """Asymptotic FLOP/s per dtype, the SM count of the curve, its anchor and fit quality."""

    peak: dict[str, float]
    sms: int
    anchor: tuple[int, int, int]
    anchor_factor: float
    quality: Quality

    def profile(self, source: str) -> GemmProfile:
        """The ``GemmProfile`` drawing the fitted curve (ceiling 1 over the fitted peaks)."""
        f = min(1.0, self.anchor_factor)
        return GemmProfile(self.sms, f, self.anchor, source, fp32_fraction=f)


def fit_gemm(
    samples: Sequence[GemmSample],
    launch_s: float,
    sms_candidates: Iterable[int] = (1, 2, 4, 8, 16, 32, 64, 128),
) -> GemmFit:
    """See the module docstring. ``launch_s``: the per-op fixed cost taken off each time."""
    if not samples:
        raise FitError("GEMM fit: no matrix products were measured")
    best: tuple[float, int, dict[str, float]] | None = None
    rate = np.array([s.flops / max(s.seconds - launch_s, 1e-12) for s in samples])
    weight = np.array([s.flops for s in samples])
    for sms in sorted(set(sms_candidates)):
        sf = np.array([shape_factor(s.shape, sms) for s in samples])
        logs = np.log(rate) - np.log(sf)
        peak: dict[str, float] = {}
        resid = 0.0
        for dt in sorted({s.dtype for s in samples}):
            sel = np.array([s.dtype == dt for s in samples])
            w = weight[sel] / weight[sel].sum()
            mu = float(np.sum(w * logs[sel]))
            peak[dt] = math.exp(mu)
            resid += float(np.sum(w * (logs[sel] - mu) ** 2))
        if best is None or resid < best[0] - 1e-12:
            best = (resid, sms, peak)
    assert best is not None
    _, sms, peak = best
    largest = max(samples, key=lambda s: s.flops).shape
    model = np.array([launch_s + s.flops / (peak[s.dtype] * shape_factor(s.shape, sms)) for s in samples])
    anchor = (largest.m, largest.n, largest.k)
    factor = shape_factor(GemmShape(1, *anchor), sms)
    return GemmFit(peak, sms, anchor, factor, _quality(model, np.array([s.seconds for s in samples])))


class FamilyFit(NamedTuple):
    """A family's fitted efficiencies and launch time, whether the data bound each, quality."""

    flop: float
    memory: float
    launch_s: float
    flop_bounded: bool
    memory_bounded: bool
    quality: Quality


_GRID = np.logspace(-4, 0, 81)


def _family_grid(
    f: np.ndarray, b: np.ndarray, t: np.ndarray, peak: np.ndarray, bw: float, ef: np.ndarray, em: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Loss and launch of every (ef, em) pair of the grid (``ef`` × ``em`` broadcast)."""
    comp = f[None, None, :] / (peak[None, None, :] * ef[:, None, None])
    mem = b[None, None, :] / (bw * em[None, :, None])
    model = np.maximum(comp, mem)
    w = 1.0 / t**2
    launch = np.clip(np.sum(w * (t - model), axis=-1) / np.sum(w), 0.0, None)
    loss = np.sum(w * (launch[..., None] + model - t) ** 2, axis=-1)
    return loss, launch


def _argmin_high(loss: np.ndarray) -> tuple[int, int]:
    """The grid point of least loss; ties (within 1e-9 relative) go to the highest efficiencies
    (an unbounded efficiency is reported as the largest one that fits)."""
    tol = loss.min() * (1 + 1e-9) + 1e-30
    idx = np.argwhere(loss <= tol)
    i, j = max((int(a), int(b)) for a, b in idx)
    return i, j


def fit_family(samples: Sequence[OpSample], peak: Callable[[str], float], bandwidth: float) -> FamilyFit:
    """See the module docstring. ``peak(dtype)``: the device's FLOP/s for a dtype name;
    ``bandwidth``: its memory bandwidth (B/s)."""
    if not samples:
        raise FitError("family fit: no ops were measured")
    f = np.array([s.flops for s in samples], dtype=float)
    b = np.array([s.nbytes for s in samples], dtype=float)
    t = np.array([s.seconds for s in samples], dtype=float)
    p = np.array([peak(s.dtype) for s in samples], dtype=float)
    loss, _ = _family_grid(f, b, t, p, bandwidth, _GRID, _GRID)
    i, j = _argmin_high(loss)
    step = _GRID[1] / _GRID[0]
    ef = np.clip(_GRID[i] * step ** np.linspace(-1, 1, 41), None, 1.0)
    em = np.clip(_GRID[j] * step ** np.linspace(-1, 1, 41), None, 1.0)
    loss2, launch2 = _family_grid(f, b, t, p, bandwidth, ef, em)
    i2, j2 = _argmin_high(loss2)
    e_f, e_m, launch = float(ef[i2]), float(em[j2]), float(launch2[i2, j2])
    comp = f / (p * e_f)
    mem = b / (bandwidth * e_m)
    model = launch + np.maximum(comp, mem)
    return FamilyFit(
        e_f,
        e_m,
        launch,
        flop_bounded=bool(np.any(comp >= mem)),
        memory_bounded=bool(np.any(mem >= comp)),
        quality=_quality(model, t),
    )


class LinkFit(NamedTuple):
    """A fitted link: bandwidth (B/s), latency (s), fit quality."""

    link: LinkSpec
    quality: Quality


def _probe(n: int, link: LinkSpec) -> Cluster:
    dev = DeviceSpec("probe", 1.0, 1.0, 1.0, 1.0, 1.0, 1, 0.0)
    return Cluster("probe", (NodeSpec("probe", dev, max(n, 2), link, link),))


def link_coefficients(
    cost: Callable[[Cluster, float, Sequence[int]], float], group: int, nbytes: float
) -> tuple[float, float]:
    """(x, y) with ``cost = x / B + y · α`` on one node of ``group`` GPUs linked by (B, α)."""
    gpus = list(range(group))
    x = cost(_probe(group, LinkSpec(1.0, 0.0)), nbytes, gpus)
    y = cost(_probe(group, LinkSpec(math.inf, 1.0)), 0.0, gpus)
    return x, y


def fit_link(
    samples: Sequence[LinkSample], cost: Callable[[Cluster, float, Sequence[int]], float]
) -> LinkFit:
    """See the module docstring. ``cost``: the collective's cost function (or ``send_time``
    wrapped to take a group), whose coefficients are probed."""
    if len(samples) < 2:
        raise FitError("link fit: needs at least two timed messages")
    xy = np.array([link_coefficients(cost, s.group, s.nbytes) for s in samples])
    t = np.array([s.seconds for s in samples])
    a = xy / t[:, None]  # relative error: each row divided by its time
    ones = np.ones_like(t)
    sol, *_ = np.linalg.lstsq(a, ones, rcond=None)
    inv_b, alpha = float(sol[0]), float(sol[1])
    if inv_b <= 0 or alpha < 0:  # non-negative least squares: one unknown at its bound
        candidates = []
        for col in (0, 1):
            c = float(a[:, col] @ ones / max(a[:, col] @ a[:, col], 1e-300))
            s = [0.0, 0.0]
            s[col] = max(c, 0.0)
            candidates.append((float(np.sum((a @ np.array(s) - 1) ** 2)), s))
        inv_b, alpha = min(candidates)[1]
    if inv_b <= 0 or float(np.max(xy[:, 0] * inv_b / t)) < 0.01:  # B explains < 1% of any time
        raise FitError(
            f"link fit of {samples[0].collective}: the times do not grow with the message size; "
            "measure larger messages"
        )
    model = xy @ np.array([inv_b, alpha])
    return LinkFit(LinkSpec(1.0 / inv_b, alpha), _quality(model, t))


class InSituSample(NamedTuple):
    """One check program: its real step (fastest after the first), its simulated step on the
    calibrated profile, and the simulated step's growth per second of launch time (``ops``) and
    per second of link latency (``messages``: 0 on one rank)."""

    program: str
    real_s: float
    sim_s: float
    ops: float
    messages: float = 0.0


class Overheads(NamedTuple):
    """The rank interpreter's overheads (s), measured by ``distir.backend.dispatch``: per op,
    per collective call (at the group size measured: 2 ranks) and per point-to-point send; and
    ``arrival_s``, what a collective call costs more when one rank waits for the other, asleep
    (measured, not in the model: a step's ranks mostly enter a collective together)."""

    op_s: float
    collective_s: float = 0.0
    p2p_s: float = 0.0
    arrival_s: float = 0.0
