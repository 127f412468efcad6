"""The search space: every strategy the model's shapes and the cluster allow, under user pins.

- (d, t, p) with d·t·p = the number of devices (any factorization, not only powers of two);
  t divides every tensor-parallel weight dimension; p·v ≤ the number of repeated blocks;
- k: every divisor of the per-replica batch up to ``max_k`` (k = 1 only without pipelining
  unless pinned: without a pipeline, microbatching only saves memory, which the memory
  ladder below covers);
- schedules: GPipe, 1F1B, interleaved (v = 2, when k is a multiple of p) and ZB-H1 for p > 1;
- the **memory ladder**: ZeRO stage and recomputation cost time and save memory, so each
  (d, t, p, k, schedule) is tried with the cheapest variant first and climbs only while the
  screen says it does not fit (``LADDER``). Pinning ``zero`` or ``recompute`` keeps only
  that rung's value.

``Pins`` holds the user's constraints (``--dp 2 --tp 8 --schedule 1f1b`` ...); each pinned
dimension is checked against what the model allows, with an error that says why not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from distir.parallel.strategy import SCHEDULES, Strategy

# cheapest first: ZeRO-1/2 cost a little communication, selective recomputation a little
# compute, ZeRO-3 a gather per layer and microbatch, full recomputation a whole forward
LADDER: tuple[tuple[int, str], ...] = (
    (0, "none"),
    (1, "none"),
    (2, "none"),
    (0, "selective"),
    (1, "selective"),
    (2, "selective"),
    (3, "none"),
    (3, "selective"),
    (0, "full"),
    (1, "full"),
    (2, "full"),
    (3, "full"),
)


class SpaceError(ValueError):
    """A pinned dimension the model or cluster cannot take; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Pins:
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    k: int | None = None
    schedule: str | None = None
    zero: int | None = None
    recompute: str | None = None
    max_k: int = 128

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "k"):
            x = getattr(self, name)
            if x is not None and (not isinstance(x, int) or x < 1):
                raise SpaceError(f"--{name} must be a positive integer, got {x!r}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise SpaceError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise SpaceError(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute is not None and self.recompute not in ("none", "selective", "full", "ops"):
            raise SpaceError(f"--recompute must be none, selective, full or ops, got {self.recompute!r}")


def divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


@dataclass(frozen=True, slots=True)
class Space:
    """Strategies for ``devices`` devices, a global ``batch`` and a model of ``n_layers``
    repeated blocks (the layer calls a pipeline partition divides: ``layer_prep.partition``)."""

    devices: int
    batch: int
    n_layers: int
    allowed_tp: tuple[int, ...]
    train: bool = True
    pins: Pins = Pins()

    def check(self) -> None:
        """Pinned values the model/cluster cannot take raise ``SpaceError``."""
        p = self.pins
        for name, x in (("dp", p.dp), ("tp", p.tp), ("pp", p.pp)):
            if x is not None and self.devices % x:
                raise SpaceError(f"--{name} {x} does not divide the cluster's {self.devices} devices")
        if p.tp is not None and p.tp not in self.allowed_tp:
            raise SpaceError(
                f"--tp {p.tp}: the model's tensor-parallel dimensions do not split {p.tp} ways "
                f"(allowed: {', '.join(map(str, self.allowed_tp))})"
            )
        if p.pp is not None and p.pp > self.n_layers:
            raise SpaceError(f"--pp {p.pp}: the model has only {self.n_layers} blocks")
        if p.dp is not None and self.batch % p.dp:
            raise SpaceError(f"--dp {p.dp} does not divide the batch {self.batch}")
        if next(self.bases(), None) is None:
            raise SpaceError(
                f"no strategy for {self.devices} devices, batch {self.batch} and these pins "
                f"(tensor parallelism allowed: {', '.join(map(str, self.allowed_tp))})"
            )

    def why_not(self, d: int, t: int, p: int) -> str | None:
        """Why the space has no strategy of shape (d, t, p), in words (``None``: exactly when
        ``bases`` yields some); the conditions of ``triples`` and ``bases``."""
        pins = self.pins
        for name, x, pin in (("dp", d, pins.dp), ("tp", t, pins.tp), ("pp", p, pins.pp)):
            if pin is not None and x != pin:
                return f"--{name} {pin} is pinned"
        if d * t * p != self.devices:
            return f"d·t·p = {d * t * p}, not the cluster's {self.devices} devices"
        if t not in self.allowed_tp:
            searched = ", ".join(map(str, self.allowed_tp))
            return (
                f"t = {t} is not a tensor-parallel degree searched here ({searched}: it stays inside "
                "a node unless --tp pins more, and must divide the model's tensor-parallel dimensions)"
            )
        if p > self.n_layers:
            return f"the model has {self.n_layers} blocks, fewer than {p} stages"
        if self.batch % d:
            return f"the batch {self.batch} does not split {d} ways"
        # the rules of ``bases``
        per_replica = self.batch // d
        if pins.k is not None and per_replica % pins.k:
            return f"-k {pins.k} does not divide the per-replica batch {per_replica}"
        sched = pins.schedule
        if p == 1 and sched not in (None, "1f1b", "gpipe"):
            return f"--schedule {sched} needs a pipeline (p > 1)"
        if p > 1 and not self.train and sched not in (None, "1f1b"):
            return f"inference runs its pipeline in 1f1b order, not --schedule {sched}"
        if next((b for b in self.bases() if (b.d, b.t, b.p) == (d, t, p)), None) is None:
            if sched == "interleaved" and 2 * p > self.n_layers:
                return f"--schedule interleaved needs 2·p = {2 * p} blocks, the model has {self.n_layers}"
            if sched == "interleaved":
                return f"--schedule interleaved needs k a multiple of p = {p}, and no such k is allowed"
            return "no microbatch count and schedule of this shape fits the pins"
        return None

    def triples(self) -> Iterator[tuple[int, int, int]]:
        p = self.pins
        for t in self.allowed_tp:
            if self.devices % t or (p.tp is not None and t != p.tp):
                continue
            for pp in divisors(self.devices // t):
                d = self.devices // (t * pp)
                if (p.pp is not None and pp != p.pp) or (p.dp is not None and d != p.dp):
                    continue
                if pp > self.n_layers or self.batch % d:
                    continue
                if not self.train and pp > self.n_layers:
                    continue
                yield d, t, pp

    def bases(self) -> Iterator[Strategy]:
        """Every (d, t, p, k, schedule, v), with ZeRO 0 and no recomputation."""
        pins = self.pins
        for d, t, pp in self.triples():
            per_replica = self.batch // d
            if pins.k is not None:
                ks = [pins.k] if per_replica % pins.k == 0 else []
            elif pp == 1:
                ks = [1]
            else:
                ks = [k for k in divisors(per_replica) if k <= pins.max_k]
            for k in ks:
                if pp == 1:
                    scheds = (
                        [(pins.schedule or "1f1b", 1)] if pins.schedule in (None, "1f1b", "gpipe") else []
                    )
                else:
                    scheds = []
                    for name in ("gpipe", "1f1b", "interleaved", "zb1") if self.train else ("1f1b",):
                        if pins.schedule is not None and name != pins.schedule:
                            continue
                        if name == "interleaved":
                            if k % pp or 2 * pp > self.n_layers:
                                continue
                            scheds.append((name, 2))
                        else:
                            scheds.append((name, 1))
                for name, v in scheds:
                    yield Strategy(d=d, t=t, p=pp, k=k, schedule=name, v=v)

    def ladder(self, base: Strategy) -> list[Strategy]:
        """The memory-saving variants of ``base``, cheapest first (module docstring)."""
        pins = self.pins
        out: list[Strategy] = []
        for zero, rec in LADDER if self.train else ((0, "none"),):
            if (pins.zero is not None and zero != pins.zero) or (
                pins.recompute is not None and rec != pins.recompute
            ):
                continue
            if zero and base.d == 1:
                continue
            out.append(
                Strategy(base.d, base.t, base.p, base.k, base.schedule, base.v, zero, rec, base.partition)
            )
        return out


__all__ = ["LADDER", "Pins", "Space", "SpaceError", "divisors"]
