"""Optimal assignment of consecutive layers to pipeline stages (heterogeneous stages, links, memory).

Problem. Layers 0..L−1 are cut into p non-empty consecutive stages; stage j runs layers
[b_j, b_{j+1}) with b_0 = 0 < b_1 < … < b_p = L. Stage j's devices may be of their own kind, so
``time[j, i]`` is layer i's time (forward + backward of one microbatch) *on stage j*. With
T_j = Σ_{i∈stage j} time[j, i], C_j = ``comm[j, b_{j+1}−1]`` (the transfer over the cut after
stage j, j < p−1) and k microbatches, the pipeline takes (AMP's formula, a link may be the
bottleneck)::

    F = (k−1)·M + S,   M = max(max_j T_j, max_j C_j),   S = Σ_j T_j + Σ_j C_j

and every stage must fit its device: Σ_{i∈stage j} ``mem[j, i]`` ≤ ``cap[j]``. ``assign_layers``
returns an assignment of minimum F (``None`` when none is feasible).

Algorithm. For a bound μ, let S(μ) be the least S over feasible assignments whose stages and cuts
all cost ≤ μ (∞ if there is none). Then

    F* = min_μ (k−1)·μ + S(μ),  μ ranging over the *candidates* V,

V = {T_j over [a, b)} ∪ {comm values}: an optimal assignment with maximum M* has S ≥ S(M*), and
M* ∈ V. S is a non-increasing step function, so a search over V only has to find the right step.

- *Min-sum for one μ* (``_Solver.dp``). With P_j the prefix sums of ``time[j]``,
  f_j(b) = P_j(b) + min_{a∈[lo_j(b), b−1]} (g_{j−1}(a) − P_j(a)), g_{j−1}(a) = f_{j−1}(a) + C(a)
  (∞ when the cut's C(a) > μ). Times and memory are non-negative, so the constraints
  P_j(b) − P_j(a) ≤ μ and Q_j(b) − Q_j(a) ≤ cap_j (Q: memory prefix sums) hold exactly on a window
  a ≥ lo_j(b) whose lower end is non-decreasing in b: a sliding-window minimum. A monotone deque
  gives it in O(L) per stage; in numpy a sparse table over the window's levels is far faster than a
  Python loop, so each evaluation costs O(p·L·log W) element operations (W ≤ L the longest
  admissible window, about L/p near the optimum) in O(p·log W) vectorized calls. Up to
  ``SMALL_LAYERS`` layers numpy's per-call overhead dominates, and the whole search runs on Python
  lists (``distir.search.assignment_list_solver.ListSolver``: the same float operations, so the
  same results bit for bit).
- *Search over μ* (branch and bound on value intervals). The solution of dp(μ) has an actual
  maximum m ≤ μ with S(m) = S(μ), so every candidate in [m, μ] is dominated by it. An interval
  (lo, hi) of unexplored candidates carries a lower bound s on S over it (S(x) for the x that
  bounded it from above; S(∞) at first), and none of its candidates can beat the incumbent F̂ unless
  (k−1)·μ + s < F̂: the interval is cut at μ < (F̂ − s)/(k−1) — the scan-and-stop rule of a
  sweep from M_min with S(∞) as the bound, but with the sharper bound of each interval. A
  surviving interval is split at a pivot μ: dp(μ) either is infeasible (all of (lo, μ] is, which
  is the bisection for M_min) or yields (m, S(μ)); the children are (lo, m) with bound S(μ) and
  (μ, hi) with the parent's bound. The pivot is the weighted median of the per-row medians of the
  interval's candidates (a row: stage j, start a, ends b in increasing order; found by
  ``searchsorted`` without listing the row), so each child holds at most 3/4 of the parent's
  candidates; an interval with at most ``MATERIALIZE_LIMIT`` candidates is listed once, sorted and
  deduplicated, and split at its median. Candidates are never all materialized.

Complexity. With n_V ≤ p·L(L+1)/2 + (p−1)(L−1) candidates and C evaluations of dp, the search
costs O(p·L·log L) to set up, O(p·L·log W) per evaluation and O(p·L·log(p·L)) per pivot of an
interval too large to list: O(p·L·log(p·L)·(1 + C)) in total.

- Each child holds at most 3/4 of its parent's candidates, so the search tree has depth
  O(log n_V); intervals at one depth are disjoint.
- Let σ be the number of distinct values S takes on the candidates below the final cut-off
  (∞, i.e. infeasible, counts as one). An interval holding candidates of two values of S
  contains a step of S, so there are at most σ of them per depth: O(σ·log n_V) in all. An
  interval on one step S₀ is closed in O(log n_V) evaluations: its lower children are explored
  first and end at the step's smallest candidate c₀; after that each upper child (μ, ·) has its own
  lower child cut, since (k−1)·c + S₀ > (k−1)·c₀ + S₀ ≥ F̂ for c > μ ≥ c₀, and only its own upper
  child continues. Hence C = O(σ·log² n_V) — a few dozen on the bench (L = 1000, p = 64,
  k = 128), where S has few steps between M_min and the cut-off.
- Worst case: σ ≤ n_V, and C ≤ n_V anyway (each evaluation removes its pivot), so
  O(p²·L³·log(p·L)) for adversarial inputs (a long staircase of S, small k). AMP's dynamic
  program costs O(k·L⁴) on every input; the bound here does not depend on k, and the typical cost
  O(σ·p·L·log(p·L)·log² n_V) is near-linear in p·L.

Why it is optimal (sketch). (1) dp(μ) is exact: stages are consecutive, so the best sum with last
cut at b only depends on the best sum of the earlier stages ending at each admissible a; the
window is exactly the set of admissible a because prefix sums are monotone. (2) No pruned candidate
can improve F̂: a candidate μ in an interval with bound s has F ≥ (k−1)·μ + s, and candidates in
[m, μ] after an evaluation have F ≥ (k−1)·m + S(μ), the value of the solution found. (3) The
optimal maximum M* is a candidate, and dp(M*) returns a solution of value ≤ F*. Every candidate
is either evaluated, dominated or cut, so the incumbent reaches F*.

Floating point. Every comparison of a stage or cut cost against μ, and of candidate values with
each other, uses one absolute tolerance ``REL_TOL × (largest stage total or link cost)``; memory
uses ``REL_TOL × (largest memory total)``. Results are exact up to (k−1) times that tolerance.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from distir.search.assignment_list_solver import ListSolver, Rows, distinct_sorted

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]

REL_TOL: Final = 1e-12
# up to this many layers, the solver works on Python lists (``ListSolver``): 1.3-2x faster than
# numpy's at GPT-3's 98 layer calls, for 2 to 64 stages
SMALL_LAYERS: Final = 128
MATERIALIZE_LIMIT: Final = 1 << 16  # candidates of an interval listed explicitly (sorted once, sliced)


class LayerAssignmentError(ValueError):
    """An argument of the layer assignment has the wrong shape, type or values."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """A cut of the layers into stages and its pipeline time.

    Invariants: ``counts`` has one positive entry per stage summing to the number of layers, and
    ``time == (k−1)·max_stage + sum_stage`` for the k it was computed with.
    """

    counts: tuple[int, ...]  # layers per stage
    time: float  # objective value (k−1)·max_stage + sum_stage
    max_stage: float  # max over T_j and C_j
    sum_stage: float  # Σ T_j + Σ C_j


@dataclass(slots=True)
class SearchStats:
    """Work done by one ``assign_layers`` call (filled in when passed as ``stats``)."""

    evaluations: int = 0  # min-sum DPs run, the one at μ = ∞ included
    infeasible: int = 0  # of which found no assignment
    listed: int = 0  # candidate values materialized over all listed intervals


@dataclass(frozen=True, slots=True)
class _Inputs:
    time: FloatArray  # (p, L)
    k: int
    comm: FloatArray  # (p−1, L−1), zeros when not given
    mem: FloatArray | None  # (p, L)
    cap: FloatArray | None  # (p,)

    @property
    def p(self) -> int:
        return int(self.time.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.time.shape[1])


def _array(name: str, x: npt.ArrayLike, shape: tuple[int, ...], *, allow_inf: bool = False) -> FloatArray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise LayerAssignmentError(f"{name}: expected a float array of shape {shape}: {e}") from None
    if a.size == 0 and math.prod(shape) == 0:
        a = a.reshape(shape)  # e.g. `[]` for the (0, L−1) links of a single stage
    if a.shape != shape:
        raise LayerAssignmentError(f"{name}: expected shape {shape}, got {a.shape}")
    if np.isnan(a).any():
        raise LayerAssignmentError(f"{name}: contains NaN")
    if not allow_inf:
        if not np.isfinite(a).all():
            raise LayerAssignmentError(f"{name}: contains an infinite value")
        if (a < 0).any():
            raise LayerAssignmentError(f"{name}: contains a negative value")
    return a


def _validate(
    time: npt.ArrayLike,
    k: int,
    comm: npt.ArrayLike | None,
    mem: npt.ArrayLike | None,
    cap: npt.ArrayLike | None,
) -> _Inputs:
    try:
        t = np.asarray(time, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise LayerAssignmentError(f"time: expected a float array of shape (p, L): {e}") from None
    if t.ndim != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise LayerAssignmentError(f"time: expected shape (p, L) with p, L >= 1, got {t.shape}")
    p, n = int(t.shape[0]), int(t.shape[1])
    t = _array("time", t, (p, n))
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise LayerAssignmentError(f"k: expected an int >= 1, got {k!r}")
    c = np.zeros((p - 1, max(n - 1, 0))) if comm is None else _array("comm", comm, (p - 1, max(n - 1, 0)))
    if (mem is None) != (cap is None):
        raise LayerAssignmentError("mem and cap: give both or neither")
    m = None if mem is None else _array("mem", mem, (p, n))
    # a capacity may be +inf (no limit) or negative (nothing fits), never NaN
    cp = None if cap is None else _array("cap", cap, (p,), allow_inf=True)
    return _Inputs(t, int(k), c, m, cp)


def _mem_tol(mem: FloatArray) -> float:
    return REL_TOL * max(float(mem.sum(axis=1).max()), 1.0)


def _few(p: int, n: int) -> bool:
    """Whether a problem has at most MATERIALIZE_LIMIT candidates in all: then every interval is
    listed, with no need to count its candidates first."""
    return p * n * (n + 1) // 2 + max(p - 1, 0) * max(n - 1, 0) <= MATERIALIZE_LIMIT


def _bounds(counts: Sequence[int], p: int, n_layers: int) -> list[int]:
    if len(counts) != p:
        raise LayerAssignmentError(f"counts: expected {p} stages, got {len(counts)}")
    if any(isinstance(c, bool) or not isinstance(c, int | np.integer) or c < 1 for c in counts):
        raise LayerAssignmentError(f"counts: expected positive ints, got {tuple(counts)}")
    if sum(counts) != n_layers:
        raise LayerAssignmentError(f"counts: expected a sum of {n_layers} layers, got {sum(counts)}")
    return [0, *itertools.accumulate(int(c) for c in counts)]


def _evaluate(counts: Sequence[int], inp: _Inputs) -> Assignment:
    """The assignment ``counts`` with its objective, summing each stage's times directly."""
    b = _bounds(counts, inp.p, inp.n_layers)
    stage = [float(inp.time[j, b[j] : b[j + 1]].sum()) for j in range(inp.p)]
    cut = [float(inp.comm[j, b[j + 1] - 1]) for j in range(inp.p - 1)]
    mx = max(stage + cut)
    sm = math.fsum(stage + cut)
    return Assignment(tuple(int(c) for c in counts), (inp.k - 1) * mx + sm, mx, sm)


def _fits(counts: Sequence[int], inp: _Inputs) -> bool:
    if inp.mem is None or inp.cap is None:
        return True
    b = _bounds(counts, inp.p, inp.n_layers)
    tol = _mem_tol(inp.mem)
    return all(float(inp.mem[j, b[j] : b[j + 1]].sum()) <= inp.cap[j] + tol for j in range(inp.p))


def objective(counts: Sequence[int], time: npt.ArrayLike, k: int, comm: npt.ArrayLike | None = None) -> float:
    """``(k−1)·max(T_j, C_j) + Σ T_j + Σ C_j`` of the assignment ``counts`` (memory is not checked)."""
    return _evaluate(counts, _validate(time, k, comm, None, None)).time


def objective_unchecked(
    counts: Sequence[int], time: FloatArray, k: int, comm: FloatArray | None = None
) -> float:
    """``objective`` for callers that build their arguments (``assign_layers_unchecked``'s
    contract), without checking them."""
    p, n = int(time.shape[0]), int(time.shape[1])
    c = np.zeros((p - 1, max(n - 1, 0))) if comm is None else comm
    return _evaluate(counts, _Inputs(time, k, c, None, None)).time


def brute_force(
    time: npt.ArrayLike,
    k: int,
    comm: npt.ArrayLike | None = None,
    mem: npt.ArrayLike | None = None,
    cap: npt.ArrayLike | None = None,
) -> Assignment | None:
    """The best of all C(L−1, p−1) compositions, each summed directly (a reference for tests)."""
    inp = _validate(time, k, comm, mem, cap)
    p, n = inp.p, inp.n_layers
    best: Assignment | None = None
    for cuts in itertools.combinations(range(1, n), p - 1):
        b = (0, *cuts, n)
        counts = tuple(b[j + 1] - b[j] for j in range(p))
        if not _fits(counts, inp):
            continue
        got = _evaluate(counts, inp)
        if best is None or got.time < best.time:
            best = got
    return best


class _Solver:
    """Prefix sums, windows and candidate rows of one validated problem."""

    def __init__(self, inp: _Inputs) -> None:
        self.inp = inp
        p, n = inp.p, inp.n_layers
        self.p, self.n = p, n
        self.P: FloatArray = np.zeros((p, n + 1))
        np.cumsum(inp.time, axis=1, out=self.P[:, 1:])
        scale = float(self.P[:, -1].max())
        if inp.comm.size:
            scale = max(scale, float(inp.comm.max()))
        self.atol = REL_TOL * (scale if scale > 0 else 1.0)
        # stage j ends at b in [j+1, n−p+j+1] and starts at a in [j, n−p+j]; only b = n matters
        # for the last stage
        self.ends: list[IntArray] = [np.arange(j + 1, n - p + j + 2) for j in range(p - 1)]
        self.ends.append(np.array([n], dtype=np.intp))
        self.starts: list[IntArray] = [np.arange(j, n - p + j + 1) for j in range(p)]
        # lowest start a allowed by memory, per end b (independent of μ)
        self.lo_mem: list[IntArray] = []
        for j in range(p):
            if inp.mem is None or inp.cap is None:
                self.lo_mem.append(np.zeros(self.ends[j].size, dtype=np.intp))
            else:
                q = np.zeros(n + 1)
                np.cumsum(inp.mem[j], out=q[1:])
                lim = q[self.ends[j]] - (float(inp.cap[j]) + _mem_tol(inp.mem))
                self.lo_mem.append(np.searchsorted(q, lim, side="left").astype(np.intp))
        # g(a) of stage j+1 adds comm of the cut at a: padded so index a = cut position
        self.cut: FloatArray = np.full((max(p - 1, 0), n + 1), np.inf)
        if p > 1:
            self.cut[:, 1:n] = inp.comm
        comm_vals = [inp.comm[j, j : n - p + j + 1] for j in range(p - 1)]
        self.comm_vals: FloatArray = distinct_sorted(np.concatenate(comm_vals)) if comm_vals else np.zeros(0)
        self.log2: IntArray = np.zeros(n + 2, dtype=np.intp)
        self.log2[2:] = np.floor(np.log2(np.arange(2, n + 2))).astype(np.intp)
        self.pow2: IntArray = np.left_shift(1, np.arange(int(self.log2[-1]) + 1)).astype(np.intp)
        self.few = _few(p, n)
        self.evaluations = 0
        self.infeasible = 0
        self.listed = 0

    def evaluate(self, counts: Sequence[int]) -> tuple[float, float, float]:
        """(objective, max, sum) of the valid assignment ``counts`` (``_evaluate``)."""
        got = _evaluate(counts, self.inp)
        return got.time, got.max_stage, got.sum_stage

    # -- min-sum DP for one bound ------------------------------------------------------------
    def dp(self, mu: float) -> tuple[tuple[int, ...], float, float] | None:
        """Least-sum assignment with every stage and cut ≤ μ (+ atol): (counts, sum, actual max).

        The sum is computed on prefix sums (it is the bound S(μ) used by the search); the caller
        re-evaluates the counts exactly.
        """
        self.evaluations += 1
        p, n = self.p, self.n
        thr = mu + self.atol
        g = np.full(n + 1, np.inf)
        g[0] = 0.0
        hs: list[FloatArray] = []
        los: list[IntArray] = []
        f = g
        for j in range(p):
            pj = self.P[j]
            b = self.ends[j]
            h = g - pj
            lo = np.maximum(np.searchsorted(pj, pj[b] - thr, side="left"), self.lo_mem[j])
            np.maximum(lo, j, out=lo)  # earlier stages need j layers (g is ∞ there anyway)
            length = b - lo
            ok = length >= 1
            f = np.full(n + 1, np.inf)
            if ok.any():
                f[b[ok]] = pj[b[ok]] + self._window_min(h, j, b[ok], lo[ok], int(length[ok].max()))
            hs.append(h)
            los.append(lo)
            if j < p - 1:
                cj = self.cut[j]
                g = f + cj
                g[cj > thr] = np.inf
                if not np.isfinite(g).any():
                    self.infeasible += 1
                    return None
        total = float(f[n])
        if not math.isfinite(total):
            self.infeasible += 1
            return None
        counts = [0] * p
        bb = n
        for j in range(p - 1, -1, -1):
            lo_b = int(los[j][bb - int(self.ends[j][0])])
            a = lo_b + int(np.argmin(hs[j][lo_b:bb]))
            counts[j] = bb - a
            bb = a
        bounds = np.concatenate(([0], np.cumsum(counts)))
        rows = np.arange(p)
        mx = float((self.P[rows, bounds[1:]] - self.P[rows, bounds[:-1]]).max())
        if p > 1:
            mx = max(mx, float(self.inp.comm[rows[:-1], bounds[1:-1] - 1].max()))
        return tuple(counts), total, mx

    def _window_min(self, h: FloatArray, base: int, b: IntArray, lo: IntArray, maxlen: int) -> FloatArray:
        """min(h[lo_i : b_i]) for each query (all non-empty), by a sparse table over h[base:]."""
        hh = h[base : int(b[-1])]
        m = hh.size
        levels = int(self.log2[maxlen])
        st = np.empty((levels + 1, m))
        st[0] = hh
        for kk in range(1, levels + 1):
            w = 1 << (kk - 1)
            np.minimum(st[kk - 1, : m - w], st[kk - 1, w:], out=st[kk, : m - w])
            st[kk, m - w :] = np.inf  # entries past the end are never queried
        kk_q = self.log2[b - lo]
        flat = st.ravel()
        row = kk_q * m
        left = flat[row + (lo - base)]
        right = flat[row + (b - base) - self.pow2[kk_q]]
        out: FloatArray = np.minimum(left, right)
        return out

    # -- candidates ------------------------------------------------------------------------------
    def _rows(self, j: int, lo: float, hi: float) -> tuple[IntArray, IntArray, IntArray]:
        """Starts a and end ranges [s, e) of stage j's segments with lo < P(b) − P(a) < hi (±rounding)."""
        pj = self.P[j]
        a = self.starts[j]
        pa = pj[a]
        s = np.maximum(np.searchsorted(pj, pa + lo, side="right"), a + 1)
        e = np.minimum(np.searchsorted(pj, pa + hi, side="left"), self.n - self.p + j + 2)
        keep = e > s
        return a[keep], s[keep], e[keep]

    def _comm_in(self, lo: float, hi: float) -> FloatArray:
        c = self.comm_vals
        out: FloatArray = c[np.searchsorted(c, lo, side="right") : np.searchsorted(c, hi, side="left")]
        return out

    def count(self, lo: float, hi: float) -> int:
        """Number of candidate values (with repetitions) strictly inside (lo + atol, hi − atol)."""
        lo_, hi_ = lo + self.atol, hi - self.atol
        total = self._comm_in(lo_, hi_).size
        for j in range(self.p):
            _, s, e = self._rows(j, lo_, hi_)
            total += int((e - s).sum())
        return total

    def listing(self, lo: float, hi: float) -> FloatArray:
        """The distinct candidate values inside (lo + atol, hi − atol), sorted, atol-close merged."""
        parts: list[FloatArray] = [self._comm_in(lo, hi)]
        for j in range(self.p):
            a, s, e = self._rows(j, lo, hi)
            if a.size == 0:
                continue
            ln = e - s
            row = np.repeat(np.arange(a.size), ln)
            offs = np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln)
            pj = self.P[j]
            parts.append(pj[s[row] + offs] - pj[a[row]])
        v = distinct_sorted(np.concatenate(parts))
        v = v[(v > lo + self.atol) & (v < hi - self.atol)]
        if v.size > 1:
            v = v[np.concatenate(([True], np.diff(v) > self.atol))]
        self.listed += int(v.size)
        return v

    def pivot(self, lo: float, hi: float) -> float | None:
        """Weighted median of the row medians of the candidates in the interval (None if empty).

        Rows are sorted, so ≥ 1/4 of the interval's candidates lie on each side of the pivot.
        """
        lo_, hi_ = lo + self.atol, hi - self.atol
        vals: list[FloatArray] = [self._comm_in(lo_, hi_)]
        weights: list[IntArray] = [np.ones(vals[0].size, dtype=np.intp)]
        for j in range(self.p):
            a, s, e = self._rows(j, lo_, hi_)
            pj = self.P[j]
            vals.append(pj[(s + e - 1) // 2] - pj[a])
            weights.append(e - s)
        v = np.concatenate(vals)
        w = np.concatenate(weights)
        keep = (v > lo_) & (v < hi_)
        v, w = v[keep], w[keep]
        if v.size == 0:
            return None
        order = np.argsort(v, kind="stable")
        cw = np.cumsum(w[order])
        return float(v[order[int(np.searchsorted(cw, cw[-1] / 2.0))]])


def assign_layers(
    time: npt.ArrayLike,
    k: int,
    comm: npt.ArrayLike | None = None,
    mem: npt.ArrayLike | None = None,
    cap: npt.ArrayLike | None = None,
    *,
    stats: SearchStats | None = None,
) -> Assignment | None:
    """An assignment of minimum pipeline time (module docstring), or None if none is feasible.

    ``time``: (p, L) per-stage layer times; ``k`` ≥ 1 microbatches; ``comm``: (p−1, L−1) cut costs
    (``comm[j, c−1]`` for the cut after layer c−1 between stages j and j+1), zeros if None;
    ``mem``/``cap``: (p, L) memory per layer on each stage and (p,) stage capacities, both or
    neither. Infeasible: p > L, or no cut fits memory. Raises ``LayerAssignmentError`` on bad input.
    """
    return _solve(_validate(time, k, comm, mem, cap), stats)


def assign_layers_unchecked(
    time: FloatArray,
    k: int,
    comm: FloatArray | None = None,
    mem: FloatArray | None = None,
    cap: FloatArray | None = None,
) -> Assignment | None:
    """``assign_layers`` for callers that build their arguments (the screen), without checking
    them: float64 arrays of the documented shapes (``comm`` None or (p−1, L−1)), ``time``,
    ``comm`` and ``mem`` finite and non-negative, ``cap`` not NaN, ``mem`` and ``cap`` both or
    neither; ``k`` an int ≥ 1. On such arguments the same answer as ``assign_layers`` (a test
    checks); on others, undefined."""
    p, n = int(time.shape[0]), int(time.shape[1])
    c = np.zeros((p - 1, max(n - 1, 0))) if comm is None else comm
    return _solve(_Inputs(time, k, c, mem, cap), None)


def _solve(inp: _Inputs, stats: SearchStats | None) -> Assignment | None:
    """``assign_layers`` on validated inputs: the list solver up to ``SMALL_LAYERS`` layers, else
    numpy's; both give the same answers bit for bit."""
    if inp.p > inp.n_layers:
        return None
    solver = _list_solver(inp) if inp.n_layers <= SMALL_LAYERS else _Solver(inp)
    try:
        return _search(solver, inp)
    finally:
        if stats is not None:
            stats.evaluations = solver.evaluations
            stats.infeasible = solver.infeasible
            stats.listed = solver.listed


def _list_solver(inp: _Inputs, rows: Rows | None = None) -> ListSolver:
    """The solver on Python lists of a validated problem with p ≤ L (on ``rows``, the problem's
    ``Rows``, when given)."""
    if rows is None:
        rows = Rows(inp.time, inp.comm, rel_tol=REL_TOL, few=_few(inp.p, inp.n_layers))
    mem_tol = _mem_tol(inp.mem) if inp.mem is not None else 0.0
    return ListSolver(rows, inp.k, inp.mem, inp.cap, mem_tol=mem_tol)


def _assignment(solver: _Solver | ListSolver, counts: tuple[int, ...]) -> Assignment:
    return Assignment(tuple(int(c) for c in counts), *solver.evaluate(counts))


def _search(solver: _Solver | ListSolver, inp: _Inputs) -> Assignment | None:
    first = solver.dp(math.inf)
    if first is None:
        return None
    best = _assignment(solver, first[0])
    k1 = inp.k - 1
    if k1 == 0:  # F = S: the unconstrained min-sum is optimal
        return best
    atol = solver.atol
    otol = inp.k * atol  # objective values carry up to (k−1)·atol + atol of rounding
    # every assignment's maximum is at least its costliest layer at its cheapest stage
    lo0 = float(inp.time.min(axis=0).max()) - 2 * atol
    # (lo, hi, s): candidates inside (lo, hi), S ≥ s on them; listed values if known
    stack: list[tuple[float, float, float, FloatArray | list[float] | None]] = [
        (lo0, first[2], first[1], None)
    ]
    while stack:
        lo, hi, s_lb, listed = stack.pop()
        # cut: a candidate μ can only win if (k−1)·μ + s < F̂ (by more than the tolerance)
        hi = min(hi, (best.time - otol - s_lb) / k1 + atol)
        if hi - lo <= 2 * atol:
            continue
        mu: float | None
        if listed is not None:
            # sorted values: ``bisect`` finds what ``searchsorted`` finds, on arrays and lists
            listed = listed[bisect_right(listed, lo + atol) :]
            listed = listed[: bisect_left(listed, hi - atol)]
        elif solver.few or solver.count(lo, hi) <= MATERIALIZE_LIMIT:
            listed = solver.listing(lo, hi)
        if listed is not None:
            if len(listed) == 0:
                continue
            mu = float(listed[len(listed) // 2])
        else:
            mu = solver.pivot(lo, hi)
            if mu is None:  # only rounding-level candidates were counted
                continue
        got = solver.dp(mu)
        stack.append((mu, hi, s_lb, listed))  # above μ: nothing new known about S
        if got is None:  # nothing fits under μ: the bisection towards M_min
            continue
        counts, s_mu, m = got
        cand = _assignment(solver, counts)
        if cand.time < best.time:
            best = cand
        stack.append((lo, m, s_mu, listed))  # [m, μ] is dominated by `cand`; below m, S ≥ S(μ)
    return best
