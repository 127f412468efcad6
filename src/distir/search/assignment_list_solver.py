"""The layer assignment's DP solver on Python lists (``ListSolver``), for small problems.

``distir.search.layer_assignment`` searches the bound μ of the pipeline's slowest stage by branch
and bound; each step asks its solver for the min-sum DP under one bound (``dp``), for the
candidate values of an interval (``count``, ``listing``, ``pivot``) and for an assignment's
objective (``evaluate``). Up to ``SMALL_LAYERS`` layers (a hundred layers or so, a few dozen
candidate values per row) numpy's per-call overhead dominates those answers; ``ListSolver`` gives them on
Python lists and is a drop-in replacement for the numpy ``_Solver``: the same float operations in
the same order on the same IEEE doubles, so the same answers bit for bit (tests compare the two on
random instances, answer by answer and search by search). In particular:

- prefix sums come from the same ``np.cumsum`` calls; ``bisect`` finds what ``searchsorted`` finds
  on those non-decreasing lists (the same ``<`` comparisons);
- ``min``/``list.index`` give the exact minimum and its first position, as ``np.min``/``np.argmin``;
  ``sorted(set(...))`` gives the distinct cut costs ``np.unique`` does (up to the sign of a zero,
  which no answer depends on: zeros only meet comparisons and sums with a bound or the tolerance);
- a stage's time is summed as numpy sums a short slice: numpy's ``add.reduce`` on a contiguous
  float64 slice is pairwise, and below 8 elements that is a plain loop from 0.0 — done the same
  way here (``seq_sum``; a test checks it against numpy); longer slices are summed by numpy.

The DP computes less than the numpy one, never anything else: stage j of p starts at a in
[j, j+m) and ends at b in [j+1, j+m] (m = L − p + 1), and of those only the ends that can still
lead to a finite total (``ListSolver.dp``); the numpy DP leaves the others infinite or computes
values that no optimal path reads. The candidates of an interval are listed by numpy in one pass
over all rows (``listing``).
"""

from __future__ import annotations

import functools
import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
# (counts, S(μ) on prefix sums, the assignment's actual maximum), as ``_Solver.dp``
DpResult = tuple[tuple[int, ...], float, float]


def distinct_sorted(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """``np.unique(a)`` of a 1-D float array, without ``np.unique``'s check for a masked array
    (which imports ``numpy.ma``, ~10 ms, the first time a process asks): the same sort (numpy's
    default kind) and the same mask of each value unlike the one before, so the same values in
    the same order, the same zero of ±0 kept. NaNs (which ``np.unique`` collapses into one) take
    ``np.unique`` itself."""
    v = np.sort(a)
    if v.size == 0 or v[-1] != v[-1]:  # empty, or a NaN (sorted last)
        return v if v.size == 0 else np.unique(a)
    return v[np.concatenate(([True], v[1:] != v[:-1]))]


class _Band(NamedTuple):
    """One stage of ``ListSolver.dp``'s forward pass: the band's first start, h = g − P_j on it,
    the first end computed and, per end from there, its window's lowest start."""

    ga: int
    h: list[float]
    b0: int
    lo_j: list[int]


def seq_sum(xs: Sequence[float]) -> float:
    """``float(np.array(xs).sum())`` for fewer than 8 elements: numpy's pairwise summation adds
    short runs one by one from 0.0 (not Python's ``sum``, which compensates from 3.12 on)."""
    total = 0.0
    for x in xs:
        total += x
    return total


@functools.lru_cache(maxsize=256)
def _grid(p: int, n: int) -> tuple[NDArray[np.intp], NDArray[np.bool_]]:
    """For p stages over n layers: each stage's starts a ∈ [j, j + m) as a (p, m) array, and the
    (p, m, n + 1) mask of the ends b ∈ [a + 1, n − p + j + 2) that ``_Solver._rows`` scans."""
    m = n - p + 1
    starts = np.arange(p)[:, None] + np.arange(m)[None, :]
    b = np.arange(n + 1)[None, None, :]
    valid = (b > starts[:, :, None]) & (b < (n - p + 2 + np.arange(p))[:, None, None])
    starts.flags.writeable = False  # shared by every solver of the shape
    valid.flags.writeable = False
    return starts, valid


@functools.lru_cache(maxsize=256)
def _segments(p: int, n: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """The distinct segments [a, b) of ``_grid(p, n)`` over all stages, as starts and ends: start
    a belongs to stages max(0, a − m + 1) … min(a, p − 1), the last of which reaches furthest,
    to b < L − p + min(a, p − 1) + 2."""
    a = np.arange(n)[:, None]
    b = np.arange(n + 1)[None, :]
    valid = (b > a) & (b < n - p + np.minimum(a, p - 1) + 2)
    starts, ends = np.nonzero(valid)
    starts.flags.writeable = False  # shared by every solver of the shape
    ends.flags.writeable = False
    return starts, ends


class Rows:
    """What a ``ListSolver`` reads of a problem's ``time`` and ``comm``, shared by the problems
    that differ only in ``k``, ``mem`` and ``cap`` (``distir.search.layer_assignment.LayerAssigner``
    builds it once for them): prefix sums and cut costs as lists, the tolerance, and whether every
    stage has the same time row (``uniform``: the screen's on one kind of GPU), in which case the
    rows are one list and the candidates are listed and counted over distinct segments once.

    ``time`` (p, L) and ``comm`` (p−1, L−1) are float64 arrays as ``layer_assignment._validate``
    returns them, with p ≤ L; ``rel_tol`` is ``REL_TOL``; ``few``: every interval is listed
    without counting (``_Solver.few``)."""

    def __init__(self, time: FloatArray, comm: FloatArray, *, rel_tol: float, few: bool) -> None:
        p, n = int(time.shape[0]), int(time.shape[1])
        self.p, self.n = p, n
        m = self.m = n - p + 1  # starts (and ends) per stage
        self.time = time
        self.P: FloatArray = np.zeros((p, n + 1))
        np.cumsum(time, axis=1, out=self.P[:, 1:])
        # bit for bit the same rows (a sign of zero apart is not the same)
        self.uniform = bool((self.P.view(np.int64) == self.P[:1].view(np.int64)).all())
        self.P_rows: list[list[float]] = [self.P[0].tolist()] * p if self.uniform else self.P.tolist()
        self.comm_rows: list[list[float]] = _rows_of(comm)
        scale = max(row[n] for row in self.P_rows)
        if p > 1 and n > 1:
            scale = max(scale, float(comm.max()))
        self.atol = rel_tol * (scale if scale > 0 else 1.0)
        # the cut costs after stage j's ends (index b − j − 1)
        self.cut_rows = [self.comm_rows[j][j : j + m] for j in range(p - 1)]
        self.few = few

    def firsts(self, thr: float) -> list[list[int]]:
        """Per stage j and end b ∈ [0, L], the first start a with P_j(a) ≥ P_j(b) − ``thr``,
        capped at b (``bisect_left``; ``searchsorted`` on all ends at once — on complex keys
        (stage, prefix sum) for all stages together when their rows differ: ``_lowest_starts``).
        One list shared by all stages when they are ``uniform``."""
        p, n = self.p, self.n
        if self.uniform:
            pj = self.P[0]
            first = np.minimum(np.searchsorted(pj, pj - thr, side="left"), self._ends)
            return [first.tolist()] * p
        keys = self._keys
        want = np.empty((p, n + 1), dtype=np.complex128)
        want.real = keys.real
        want.imag = self.P - thr
        found = np.searchsorted(keys.ravel(), want.ravel(), side="left").reshape(p, n + 1)
        found -= self._row_base
        np.minimum(found, self._ends, out=found)
        out: list[list[int]] = found.tolist()
        return out

    @functools.cached_property
    def _ends(self) -> NDArray[np.intp]:
        return np.arange(self.n + 1)

    @functools.cached_property
    def _row_base(self) -> NDArray[np.intp]:
        return ((self.n + 1) * np.arange(self.p))[:, None]

    @functools.cached_property
    def _keys(self) -> NDArray[np.complex128]:
        """(stage, prefix sum) as complex numbers, sorted lexicographically (``firsts``)."""
        keys = np.empty((self.p, self.n + 1), dtype=np.complex128)
        keys.real = np.arange(self.p)[:, None]
        keys.imag = self.P
        return keys

    # the two below are built on first use: most searches never list candidates nor evaluate
    @functools.cached_property
    def time_rows(self) -> list[list[float]]:
        """``time`` as lists (``evaluate``)."""
        rows: list[list[float]] = self.time.tolist()
        return rows

    @functools.cached_property
    def comm_vals(self) -> list[float]:
        """The distinct cut costs at admissible cuts, sorted (``_Solver.comm_vals``)."""
        return sorted({c for j in range(self.p - 1) for c in self.cut_rows[j]})


def _rows_of(a: FloatArray) -> list[list[float]]:
    """``a.tolist()``, one list shared by rows that are the same bit for bit."""
    if a.shape[0] > 1 and bool((a.view(np.int64) == a[:1].view(np.int64)).all()):
        return [a[0].tolist()] * a.shape[0]
    rows: list[list[float]] = a.tolist()
    return rows


def _lowest_starts(mem: FloatArray, cap: FloatArray, mem_tol: float, m: int) -> list[list[int]]:
    """Per stage j and end b (index b − j − 1; the last stage: b = L only), the lowest start a
    with Σ mem[j, a:b] ≤ cap[j] + ``mem_tol``, at least j: ``searchsorted`` on each stage's
    non-decreasing memory prefix sums, for all stages in one call — on complex keys (stage,
    prefix sum), which numpy orders lexicographically, so a stage's keys compare by their prefix
    sums alone and sit after every earlier stage's."""
    p, n = int(mem.shape[0]), int(mem.shape[1])
    Q = np.zeros((p, n + 1))
    np.cumsum(mem, axis=1, out=Q[:, 1:])  # row by row as ``_Solver``'s 1-D cumsums
    ends = np.arange(m)[None, :] + np.arange(1, p + 1)[:, None]  # stage j: [j + 1, j + m]
    ends[-1] = n  # only b = L for the last stage
    room = cap + mem_tol
    keys = np.empty((p, n + 1), dtype=np.complex128)
    keys.real = np.arange(p)[:, None]
    keys.imag = Q
    want = np.empty((p, m), dtype=np.complex128)
    want.real = keys.real[:, :m]
    want.imag = np.take_along_axis(Q, ends, axis=1) - room[:, None]
    found = np.searchsorted(keys.ravel(), want.ravel(), side="left").reshape(p, m)
    lo = np.maximum(found - (n + 1) * np.arange(p)[:, None], np.arange(p)[:, None])
    out: list[list[int]] = lo.tolist()
    out[-1] = out[-1][:1]
    return out


class ListSolver:
    """The solver of one problem on Python lists (module docstring).

    ``rows``: the problem's ``Rows``; ``k`` ≥ 1; ``mem`` (p, L) and ``cap`` (p,) float64 arrays,
    both or neither (memory finite and non-negative, ``cap`` not NaN); ``mem_tol`` is the search's
    memory tolerance (``_mem_tol(mem)``). Counts ``evaluations``, ``infeasible`` and ``listed``
    as ``_Solver`` does."""

    def __init__(
        self,
        rows: Rows,
        k: int,
        mem: FloatArray | None,
        cap: FloatArray | None,
        *,
        mem_tol: float,
    ) -> None:
        self.rows = rows
        self.k = k
        p, m = self.p, self.m = rows.p, rows.m
        self.n = rows.n
        self.time, self.P, self.P_rows, self.comm_rows = rows.time, rows.P, rows.P_rows, rows.comm_rows
        self.cut_rows, self.atol, self.few = rows.cut_rows, rows.atol, rows.few
        # per stage and end b (index b − j − 1; the last stage: b = L only), the lowest start
        # allowed by memory and by the stages before (j layers), independent of μ
        if mem is None or cap is None:
            self.lo_min: list[list[int]] = [[j] * m for j in range(p - 1)] + [[p - 1]]
        else:
            self.lo_min = _lowest_starts(mem, cap, mem_tol, m)
        self.evaluations = 0
        self.infeasible = 0
        self.listed = 0

    @property
    def time_rows(self) -> list[list[float]]:
        """``Rows.time_rows``."""
        return self.rows.time_rows

    @property
    def comm_vals(self) -> list[float]:
        """``Rows.comm_vals``."""
        return self.rows.comm_vals

    def dp(self, mu: float) -> DpResult | None:
        """``_Solver.dp(mu)``: the least-sum assignment with every stage and cut ≤ μ (+ atol).

        Only *useful* ends are computed. From the back: a window's start only grows with its
        end, so the stages after stage j can reach L only from an end b ≥ low[j] (the window
        start of stage j+1's lowest useful end); every feasible assignment's ends are useful,
        and a useful end's window holds only useful ends of the stage before (``_low_ends``).
        From the front: stage by stage on the *band* of starts a where g(a) may be finite (∞
        elsewhere, as in the numpy DP), and ends whose window meets it (``_stage_ends``). A
        window's minimum is exact and does not depend on entries that are ∞ or left out (min
        over the band's part of the window), so every f(b) of a useful end, the total and every
        first argmin of the backtracking (``_backtrack``) are the numpy DP's, which is
        infeasible exactly when no useful end is finite."""
        self.evaluations += 1
        thr = mu + self.atol
        firsts = self.rows.firsts(thr)
        low = self._low_ends(firsts)
        got = None if low is None else self._forward(thr, firsts, low)
        if got is None:
            self.infeasible += 1
            return None
        bands, f_last = got
        counts = self._backtrack(bands)
        return counts, f_last, self._actual_max(counts)

    def _low_ends(self, firsts: list[list[int]]) -> list[int] | None:
        """Per stage its lowest useful end under the bound of ``firsts`` (``Rows.firsts``; ``dp``),
        from the back (the last stage ends at L); None when nothing reaches L."""
        p, m = self.p, self.m
        low = [0] * p
        b = self.n
        for j in range(p - 1, 0, -1):
            lm = self.lo_min[j][b - j - 1 if j < p - 1 else 0]
            lo = firsts[j][b]  # ``searchsorted`` from j (j < b), capped at b
            if j > lo:
                lo = j
            b = lo if lo > lm else lm
            if b > j - 1 + m:  # past stage j − 1's last end: nothing reaches L
                return None
            low[j - 1] = b
        return low

    def _forward(
        self, thr: float, firsts: list[list[int]], low: list[int]
    ) -> tuple[list[_Band], float] | None:
        """The DP from the front on the band of starts (``dp``; ``firsts``: ``Rows.firsts`` of
        its bound ``thr``): per stage its ``_Band``, and the least sum; None if infeasible."""
        p, n = self.p, self.n
        ga, g = 0, [0.0]  # the band: g(a) for a in [ga, ga + len(g)); ∞ elsewhere
        bands: list[_Band] = []
        for j in range(p):
            pj = self.P_rows[j]
            gb = ga + len(g)
            h = list(map(operator.sub, g, pj[ga:gb]))
            if j == p - 1:
                # the first a >= ga with pj[a] >= pj[n] − thr (``searchsorted``, capped at n):
                # the numpy DP's start raised to ga, which only drops infinite h
                lo = firsts[j][n]
                if ga > lo:
                    lo = ga
                if self.lo_min[j][0] > lo:
                    lo = self.lo_min[j][0]
                if lo >= gb:
                    return None
                bands.append(_Band(ga, h, n, [lo]))
                return bands, pj[n] + min(h[lo - ga :])
            b0 = ga + 1 if ga + 1 > low[j] else low[j]
            f, lo_j = self._stage_ends(j, firsts[j], ga, h, b0)
            # the next stage's band: its starts are these ends; trimmed to its finite values
            cut = self.cut_rows[j]
            c0 = b0 - j - 1  # cut index of the end b0
            g = [math.inf if c > thr else x + c for x, c in zip(f, cut[c0 : c0 + len(f)], strict=True)]
            first, last = 0, len(g)
            while first < last and g[first] == math.inf:
                first += 1
            if first == last:
                return None
            while g[last - 1] == math.inf:
                last -= 1
            bands.append(_Band(ga, h, b0, lo_j))
            ga, g = b0 + first, g[first:last]
        raise AssertionError("unreachable: the last stage returns")

    def _stage_ends(
        self, j: int, first: list[int], ga: int, h: list[float], b0: int
    ) -> tuple[list[float], list[int]]:
        """Stage j (not the last) on the band of starts from ``ga`` (``h`` = g − P_j there;
        ``first``: its row of ``Rows.firsts``): f(b) and the window's lowest start for its ends b
        from ``b0`` on, until a window starts past the band."""
        pj = self.P_rows[j]
        lo_min = self.lo_min[j]
        e0, top = j + 1, j + self.m + 1  # stage j's ends are [e0, top)
        gb = ga + len(h)
        inf = math.inf
        f: list[float] = []
        lo_j: list[int] = []
        # per useful end b from ga + 1 on (a window below it misses the band), its lowest
        # start: max(ga, first[b], memory's limit); the windows' starts only grow, so once one
        # is past the band every later one is
        # min over the last window, for the next when it only grows by one on the right
        # (``<`` keeps the first of equal values, as ``min`` does)
        cur, cur_lo, cur_b = inf, -1, -1
        f_append, lo_append = f.append, lo_j.append
        for b, lm, lo in zip(range(b0, top), lo_min[b0 - e0 : top - e0], first[b0:top], strict=True):
            if ga > lo:
                lo = ga
            if lm > lo:
                lo = lm
            if lo >= gb:
                break
            lo_append(lo)
            if b > lo:
                if lo == cur_lo and b == cur_b + 1:
                    if b <= gb:
                        x = h[b - 1 - ga]
                        if x < cur:
                            cur = x
                else:
                    cur = min(h[lo - ga : b - ga])
                cur_lo, cur_b = lo, b
                f_append(pj[b] + cur)
            else:
                f_append(inf)
        return f, lo_j

    def _backtrack(self, bands: list[_Band]) -> tuple[int, ...]:
        """Layers per stage of the least-sum assignment: from the last stage back, each stage's
        first best start in its end's window."""
        counts = [0] * self.p
        bb = self.n
        for j in range(self.p - 1, -1, -1):
            ga, h, b0, lo_j = bands[j]
            lo_b = lo_j[bb - b0]
            seg = h[lo_b - ga : bb - ga]
            a = lo_b + seg.index(min(seg))
            counts[j] = bb - a
            bb = a
        return tuple(counts)

    def _actual_max(self, counts: tuple[int, ...]) -> float:
        """The costliest stage or cut of ``counts``, on prefix sums."""
        mx = -math.inf
        a = 0
        for j in range(self.p):
            b = a + counts[j]
            mx = max(mx, self.P_rows[j][b] - self.P_rows[j][a])
            if j < self.p - 1:
                mx = max(mx, self.comm_rows[j][b - 1])
            a = b
        return mx

    # -- candidates ------------------------------------------------------------------------------
    def _rows(self, j: int, lo: float, hi: float) -> list[tuple[int, int, int]]:
        """``_Solver._rows``: (a, s, e) of stage j's segments [a, b), b in [s, e), with
        lo < P(b) − P(a) < hi (±rounding), the empty ones left out."""
        pj = self.P_rows[j]
        top = self.n - self.p + j + 2
        out = []
        for a in range(j, j + self.m):
            pa = pj[a]
            # max(searchsorted(pj, pa + lo, "right"), a + 1), min(searchsorted(pj, pa + hi), top)
            s = bisect_right(pj, pa + lo, a + 1)
            e = bisect_left(pj, pa + hi, a + 1, top)
            if e > s:
                out.append((a, s, e))
        return out

    def _comm_in(self, lo: float, hi: float) -> list[float]:
        c = self.comm_vals
        return c[bisect_right(c, lo) : bisect_left(c, hi)]

    def count(self, lo: float, hi: float) -> int:
        """``_Solver.count``: candidate values (with repetitions) inside (lo + atol, hi − atol).

        With ``uniform`` rows, the (s, e) of ``_rows`` for all stages at once: s does not depend
        on the stage, e is the same ``searchsorted`` clamped to the stage's [a + 1, top)."""
        lo_, hi_ = lo + self.atol, hi - self.atol
        total = len(self._comm_in(lo_, hi_))
        if self.rows.uniform:
            pj = self.P[0]
            a = np.arange(self.n)
            s = np.maximum(np.searchsorted(pj, pj[:-1] + lo_, side="right"), a + 1)
            e = np.maximum(np.searchsorted(pj, pj[:-1] + hi_, side="left"), a + 1)
            starts, _ = _grid(self.p, self.n)
            tops = (self.n - self.p + 2 + np.arange(self.p))[:, None]
            return total + int(np.maximum(np.minimum(e[starts], tops) - s[starts], 0).sum())
        for j in range(self.p):
            for _, s, e in self._rows(j, lo_, hi_):
                total += e - s
        return total

    def listing(self, lo: float, hi: float) -> list[float]:
        """``_Solver.listing`` as a list: the distinct candidates inside (lo + atol, hi − atol),
        sorted, each within atol of the one before dropped.

        One numpy pass over every (stage, start, end) at once (the row-by-row loop costs more
        in Python than in numpy here: a listing holds a thousand values or so). The mask is
        ``_Solver._rows``' range: on non-decreasing prefix sums, b ≥ searchsorted(pj, pa + lo,
        "right") is pj[b] > pa + lo and b < searchsorted(pj, pa + hi) is pj[b] < pa + hi; the
        values, the dedup and the merge are ``_Solver.listing``'s operations. With ``uniform``
        rows every stage has the same values on a segment [a, b): each distinct segment
        (``_segments``) once, which leaves the distinct values as they were."""
        if self.rows.uniform:
            starts, ends = _segments(self.p, self.n)
            pa, pb = self.P[0][starts], self.P[0][ends]
        else:
            starts, valid = _grid(self.p, self.n)
            pb = self.P[:, None, :]
            pa = np.take_along_axis(self.P, starts, axis=1)[:, :, None]
        inside = (pb > pa + lo) & (pb < pa + hi)
        if not self.rows.uniform:
            inside &= valid
        comm = np.array(self._comm_in(lo, hi), dtype=np.float64)
        v = distinct_sorted(np.concatenate((comm, (pb - pa)[inside])))
        v = v[(v > lo + self.atol) & (v < hi - self.atol)]
        if v.size > 1:
            v = v[np.concatenate(([True], np.diff(v) > self.atol))]
        self.listed += int(v.size)
        out: list[float] = v.tolist()
        return out

    def pivot(self, lo: float, hi: float) -> float | None:
        """``_Solver.pivot``: the weighted median of the row medians of the interval's candidates."""
        lo_, hi_ = lo + self.atol, hi - self.atol
        vals: list[tuple[float, int]] = [(v, 1) for v in self._comm_in(lo_, hi_) if lo_ < v < hi_]
        for j in range(self.p):
            pj = self.P_rows[j]
            for a, s, e in self._rows(j, lo_, hi_):
                v = pj[(s + e - 1) // 2] - pj[a]
                if lo_ < v < hi_:
                    vals.append((v, e - s))
        if not vals:
            return None
        # a stable sort by value (``argsort(kind="stable")``); weights are ints, compared exactly
        vals.sort(key=operator.itemgetter(0))
        cw: list[int] = []
        acc = 0
        for _, w in vals:
            acc += w
            cw.append(acc)
        return vals[bisect_left(cw, cw[-1] / 2.0)][0]

    def evaluate(self, counts: Sequence[int]) -> tuple[float, float, float]:
        """``layer_assignment._evaluate`` of valid ``counts``: (objective, max, sum), summing each
        stage's times as numpy does (module docstring)."""
        stage: list[float] = []
        a = 0
        for j, c in enumerate(counts):
            b = a + c
            stage.append(seq_sum(self.time_rows[j][a:b]) if c < 8 else float(self.time[j, a:b].sum()))
            a = b
        cut: list[float] = []
        a = 0
        for j in range(self.p - 1):
            a += counts[j]
            cut.append(self.comm_rows[j][a - 1])
        mx = max(stage + cut)
        sm = math.fsum(stage + cut)
        return (self.k - 1) * mx + sm, mx, sm
