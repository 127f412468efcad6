"""When nothing fits: the smallest changes that would, each estimated by the screen.

``advise(req, screen, screened)`` starts from the nearest strategy (the least out of memory) and
estimates, one change at a time: ZeRO-3 (with d > 1), full recomputation, smaller microbatches
(k doubled while the batch divides), all of those together, and — for a cluster written as one
preset, ``NAME`` or ``NAME:N`` — 2, 4 or 8 times the nodes, the extra GPUs as more pipeline
stages or as ZeRO-3 replicas (whichever needs less memory; the screen re-profiled on the larger
cluster). A change the user's pins forbid is still shown, marked pinned: the user asked, and it
is the way out. ``advice_lines`` words them: how much memory each needs against the capacity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

from distir.hardware.cluster import parse_cluster
from distir.hardware.presets import PRESETS
from distir.limits import MAX_DEVICES, exceeds, is_digits
from distir.parallel.strategy import Strategy, StrategyError
from distir.search.profile import Profiler
from distir.search.screen import Estimate, Screen
from distir.sim.summary import format_seconds

GIB = float(1 << 30)
SCALES = (2, 4, 8)


class Change(NamedTuple):
    what: str  # e.g. "ZeRO-3", "2× the nodes (dgx-a100:4)"
    estimate: Estimate
    pinned: tuple[str, ...] = ()  # the pins it overrides, e.g. ("--zero",)


def _estimate(screen: Screen, s: Strategy) -> Estimate | None:
    """The screen's estimate, None for a strategy the model or cluster cannot take."""
    if s.devices > screen.cluster.num_devices or screen.problem.batch % (s.d * s.k):
        return None
    try:
        return screen.estimate(s, tuple(range(screen.cluster.num_devices)))
    except (StrategyError, ValueError):
        return None


def _smaller_microbatches(screen: Screen, s: Strategy) -> Iterator[Strategy]:
    k = s.k * 2
    while screen.problem.batch % (s.d * k) == 0:
        yield dataclasses.replace(s, k=k)
        k *= 2


def _single_changes(screen: Screen, s: Strategy) -> list[tuple[str, Strategy, tuple[str, ...]]]:
    pins = []
    out: list[tuple[str, Strategy, tuple[str, ...]]] = []
    if s.d > 1 and s.zero < 3:
        out.append(("ZeRO-3", dataclasses.replace(s, zero=3), ("--zero",)))
        pins.append("--zero")
    if s.recompute != "full":
        out.append(("full recomputation", dataclasses.replace(s, recompute="full"), ("--recompute",)))
        pins.append("--recompute")
    smaller = list(_smaller_microbatches(screen, s))
    for t in smaller:
        e = _estimate(screen, t)
        if (e is not None and e.fits) or t is smaller[-1]:
            mb = screen.problem.batch // (t.d * t.k)
            out.append((f"microbatch {mb} (k{t.k})", t, ("--microbatches",)))
            pins.append("--microbatches")
            break
    if len(out) > 1:
        combined = s
        for _, t, _ in out:
            combined = dataclasses.replace(combined, zero=max(combined.zero, t.zero), k=max(combined.k, t.k))
            if t.recompute == "full":
                combined = dataclasses.replace(combined, recompute="full")
        out.append(("all of these", combined, tuple(pins)))
    return out


def _preset_scale(cluster: object) -> tuple[str, int] | None:
    """(preset, nodes) of a cluster written ``NAME`` or ``NAME:N``, else None."""
    if not isinstance(cluster, str):
        return None
    name, _, n = cluster.strip().partition(":")
    if name not in PRESETS or (n and not is_digits(n)):
        return None
    return name, int(n or 1)


def _more_gpus(screen: Screen, s: Strategy, cluster: str) -> Change | None:
    """The first node count (2, 4, 8×) on which the nearest strategy, scaled, fits; else the
    largest tried."""
    scale = _preset_scale(cluster)
    if scale is None:
        return None
    name, nodes = scale
    last = None
    for f in SCALES:
        if exceeds(screen.cluster.num_devices * f, MAX_DEVICES):  # no larger cluster is built
            break
        spec = f"{name}:{nodes * f}"
        old = screen.profiler
        prof = Profiler(
            old.spec,
            parse_cluster(spec),
            old.dtype,
            old.train,
            mixed=old.mixed,
            tp_comm_overlap=old.tp_comm_overlap,
            form=old.form,
        )
        big = Screen(prof, screen.problem)
        base = dataclasses.replace(s, partition="uniform", placement=None, shares=None)
        tries = [dataclasses.replace(base, p=s.p * f)]
        if s.k % f == 0:
            tries.append(dataclasses.replace(base, d=s.d * f, k=s.k // f, zero=3))
        got = [e for e in (_estimate(big, t) for t in tries) if e is not None]
        if not got:
            continue
        e = min(got, key=lambda e: e.peak_memory_bytes)
        last = Change(f"{f}× the nodes ({spec})", e)
        if e.fits:
            return last
    return last


def advise(cluster: object, screen: Screen, screened: list[Estimate]) -> list[Change]:
    """The changes (module docstring) to the nearest of ``screened`` (none fits) on ``cluster``
    (the request's spec or Cluster)."""
    if not screened:
        return []
    nearest = max(screened, key=lambda e: e.memory_headroom).strategy
    out: list[Change] = []
    for what, t, pins in _single_changes(screen, nearest):
        e = _estimate(screen, t)
        if e is not None:
            out.append(Change(what, e, pins))
    if isinstance(cluster, str):
        more = _more_gpus(screen, nearest, cluster)
        if more is not None:
            out.append(more)
    return out


def advice_lines(screened: list[Estimate], changes: list[Change], pinned: set[str]) -> list[str]:
    """The advice in words: the nearest strategy's shortfall, then each change's memory."""
    if not screened:
        return []
    near = max(screened, key=lambda e: e.memory_headroom)
    lines = [
        f"nothing fits: the nearest, {near.strategy}, needs {near.peak_memory_bytes / GIB:.1f} GiB per "
        f"GPU of the {near.capacity_bytes / GIB:.0f} GiB usable ({-near.memory_headroom / GIB:.1f} GiB "
        "over). Changes that would help, as the screen estimates them:"
    ]
    for c in changes:
        e = c.estimate
        state = "fits" if e.fits else f"still {-e.memory_headroom / GIB:.1f} GiB over"
        overrides = [p for p in c.pinned if p in pinned]
        note = f" (overrides your {', '.join(overrides)})" if overrides else ""
        lines.append(
            f"  {c.what}: {e.strategy}, {e.peak_memory_bytes / GIB:.1f} GiB of "
            f"{e.capacity_bytes / GIB:.0f} — {state}, step {format_seconds(e.step_time_s)}{note}"
        )
    return lines


__all__ = ["Change", "advice_lines", "advise"]
