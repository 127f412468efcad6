"""The search space: every strategy the model's shapes and the cluster allow, under user pins.

- (d, t, c, p) with d·t·c·p = the number of devices (any factorization, not only powers of two);
  t divides every tensor-parallel weight dimension; p·v ≤ the number of repeated blocks;
- **context parallelism** (c > 1: ring attention over the sequence, ``distir.parallel.context``)
  only for long sequences — ``seq`` ≥ ``CP_MIN_SEQ`` (16K, where attention's S² and the
  activations start to dominate; ``--cp-from-seq`` moves the bound) — or when pinned
  (``--cp``): every divisor c of the devices that cuts the sequence into 2c equal chunks of at
  least ``CP_MIN_CHUNK`` positions each
  (shorter chunks cannot hide the ring's transfers behind their attention); otherwise c = 1 and
  the space is what it was. A context-parallel plan is built and simulated like any other
  (``distribute``), so the space holds what ``distribute`` combines with c > 1: sequence
  parallelism (the sequence split over cp, and over tp inside each cp rank's block: one dim
  nested along two mesh axes), data parallelism, microbatches of several sequences, ZeRO 1–3
  over the d·c ranks and HSDP over a group of replicas' context ranks (the cross entropy runs on
  (batch, sequence) rows, sharded over dp and cp: ``distir.parallel.context_model``);
- the **microbatch** (samples per replica and microbatch, what users set as the per-GPU
  microbatch size): every divisor b of the per-replica batch with k = per-replica / b ≤ ``max_k``
  gradient-accumulation steps, for every p — p = 1 included, so FSDP/ZeRO-3 with one or two
  sequences per GPU and gradient accumulation is in the space;
- schedules: GPipe, 1F1B, interleaved (v = 2, when k is a multiple of p) and ZB-H1 for p > 1;
- **sequence parallelism** (Megatron's, on the tensor-parallel group): with t > 1, every base
  with and without it (its activations between layers sharded along the sequence: less memory,
  the same collective volume), one-sample microbatches included;
- the **memory ladder**: ZeRO stage and recomputation cost time and save memory, so each
  (d, t, p, k, schedule) is tried with the cheapest variant first and climbs only while the
  screen says it does not fit (``LADDER``). Where a stage's replicas span more than a node
  (d·t > ``node_devices``), each ZeRO-3 rung is tried first as HSDP (``z3h<n>``: sharded within
  the node's n = node_devices / t replicas, replicated across nodes), then as plain ZeRO-3.
  Under a pipeline (p > 1, k > 1) the ZeRO-1 rungs are left out unless ``--zero 1`` is pinned:
  there ZeRO-2 holds ZeRO-1's memory (the accumulated gradient whole, as Megatron-LM's
  distributed optimizer: ``distir.parallel.grad_reduction``) and reduce-scatters it where ZeRO-1
  all-reduces, so it is never slower.

``Pins`` holds the user's constraints (``--dp 2 --tp 8 --schedule 1f1b -k 8 --hsdp 8`` ...): any
subset of the parts may be pinned and the rest is searched; each pinned part is checked against
what the model allows, with an error that says why not.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

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


CP_MIN_SEQ = 16384  # context parallelism is searched from this sequence length on (unless pinned)
CP_MIN_CHUNK = 2048  # positions per chunk (of 2c) at least, for a searched c


MAX_K = 128  # the largest k the search tries unless told (``--max-microbatches``)


def max_k_error(k: int | None, max_k: int | None) -> str | None:
    """A pinned k above a bound the user gave on k (``-k 4 --max-microbatches 2``) contradicts
    it; a pinned k may exceed the default bound (``MAX_K``). None: no contradiction."""
    if k is None or max_k is None or k <= max_k:
        return None
    return f"-k {k} is above --max-microbatches {max_k}: the pin and the bound contradict; give one"


@dataclass(frozen=True, slots=True)
class Pins:
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    k: int | None = None
    schedule: str | None = None
    zero: int | None = None
    recompute: str | None = None
    max_k: int = MAX_K
    mbs: int | None = None  # samples per replica and microbatch
    hsdp: int | None = None  # the HSDP shard group (ZeRO-3 over this many replicas)
    cp: int | None = None  # context parallelism (ranks of the ring over the sequence)
    sp: bool | None = None  # sequence parallelism (with t > 1) on or off
    # context parallelism is searched from this sequence length on (a bound, like max_k)
    cp_from_seq: int = CP_MIN_SEQ

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "k", "mbs", "hsdp", "cp", "cp_from_seq"):
            x = getattr(self, name)
            if x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < 1):
                raise SpaceError(f"--{_FLAG.get(name, name)} must be a positive integer, got {x!r}")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise SpaceError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise SpaceError(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute is not None and self.recompute not in RECOMPUTES:
            raise SpaceError(f"--recompute must be none, selective, full or ops, got {self.recompute!r}")
        if self.hsdp is not None and (self.hsdp < 2 or self.zero not in (None, 3)):
            raise SpaceError(
                f"--hsdp {self.hsdp}: HSDP shards ZeRO-3 over groups of at least 2 replicas"
                + (f", not with --zero {self.zero}" if self.zero not in (None, 3) else "")
            )

    @property
    def pinned(self) -> bool:
        """Whether any part of the strategy is pinned (``max_k`` is a bound, not a pin)."""
        return any(
            getattr(self, f) is not None
            for f in ("dp", "tp", "pp", "k", "schedule", "zero", "recompute", "mbs", "hsdp", "cp", "sp")
        )


_FLAG = {"k": "microbatches", "mbs": "microbatch-size", "cp_from_seq": "cp-from-seq"}
RECOMPUTES = ("none", "selective", "full", "ops")


def divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


def _divisors_fast(n: int) -> list[int]:
    """``divisors(n)`` in √n steps (a batch is up to ``MAX_BATCH``)."""
    small = [i for i in range(1, math.isqrt(n) + 1) if n % i == 0]
    return sorted({*small, *(n // i for i in small)})


@dataclass(frozen=True, slots=True)
class Space:
    """Strategies for ``devices`` devices, a global ``batch`` and a model of ``n_layers``
    repeated blocks (the layer calls a pipeline partition divides: ``distir.parallel.pipeline.partition``);
    ``node_devices``: GPUs per node (0: HSDP is not tried unless pinned); ``seq``: the model's
    sequence length (0: it has none, and no context parallelism); ``sequence``: the model has a
    sequence dim to shard (sequence parallelism is searched with t > 1); ``no_context``: why its
    attention cannot run context-parallel, if it cannot (then no context parallelism)."""

    devices: int
    batch: int
    n_layers: int
    allowed_tp: tuple[int, ...]
    train: bool = True
    pins: Pins = Pins()
    node_devices: int = 0
    seq: int = 0
    sequence: bool = True
    # why the model's attention cannot run context-parallel ("": it can; ``context_refusal``)
    no_context: str = ""

    def check(self) -> None:
        """Pinned values the model/cluster cannot take raise ``SpaceError``."""
        p = self.pins
        for name, x in (("dp", p.dp), ("tp", p.tp), ("pp", p.pp)):
            if x is not None and self.devices % x:
                raise SpaceError(f"--{name} {x} does not divide the cluster's {self.devices} devices")
        self._check_degree_product()
        if p.tp is not None and p.tp not in self.allowed_tp:
            if self.allowed_tp == (1,):
                raise SpaceError(
                    f"--tp {p.tp}: no weight of the model is tensor-parallel (no name matches a placement "
                    "pattern, and --tp-layout auto, if given, sharded none; t > 1 would replicate the model)"
                )
            raise SpaceError(
                f"--tp {p.tp}: the model's tensor-parallel dimensions (its sharded weights' dims, attention "
                f"heads, query groups and FFN columns) do not split {p.tp} ways "
                f"(allowed: {', '.join(map(str, self.allowed_tp))})"
            )
        if p.cp is not None and p.cp > 1:
            if self.devices % p.cp:
                raise SpaceError(f"--cp {p.cp} does not divide the cluster's {self.devices} devices")
            if not self.seq:
                raise SpaceError(f"--cp {p.cp}: the model has no sequence to split")
            if self.no_context:
                raise SpaceError(f"--cp {p.cp}: {self.no_context}")
            if self.seq % (2 * p.cp):
                raise SpaceError(
                    f"--cp {p.cp}: context parallelism cuts the sequence into 2c = {2 * p.cp} equal chunks; "
                    f"{self.seq} positions do not divide"
                )
        if p.sp and not self.sequence:
            raise SpaceError("sequence parallelism pinned, but the model declares no sequence dim to shard")
        if p.pp is not None and p.pp > self.n_layers:
            raise SpaceError(f"--pp {p.pp}: the model has only {self.n_layers} blocks")
        if p.dp is not None and self.batch % p.dp:
            do = ", ".join(map(str, divisors(math.gcd(self.batch, self.devices))))
            raise SpaceError(
                f"--dp {p.dp} does not divide the batch {self.batch} (data-parallel degrees that do, "
                f"on {self.devices} devices: {do})"
            )
        self._check_microbatch_pins()
        if p.hsdp is not None and self.devices % p.hsdp:
            groups = ", ".join(str(h) for h in divisors(self.devices)[1:-1]) or "none"
            raise SpaceError(
                f"--hsdp {p.hsdp} must divide the data-parallel degree d, a divisor of the {self.devices} "
                f"devices (HSDP groups that do: {groups})"
            )
        if not self.train:
            given: tuple[tuple[str, object, object], ...] = (
                ("zero", p.zero, 0),
                ("recompute", p.recompute, "none"),
                ("hsdp", p.hsdp, None),
            )
            for flag, val, free in given:
                if val is not None and val != free:
                    raise SpaceError(f"--{flag} {val}: inference keeps no gradients or optimizer state")
            if p.cp is not None and p.cp > 1:
                raise SpaceError(f"--cp {p.cp}: context parallelism runs training steps only, not inference")
            if p.schedule in ("interleaved", "zb1"):
                raise SpaceError(f"--schedule {p.schedule}: inference runs its pipeline in 1f1b order")
        if p.hsdp is not None and p.dp is not None and (p.dp % p.hsdp or p.hsdp >= p.dp):
            raise SpaceError(
                f"--hsdp {p.hsdp} must divide --dp {p.dp} and be smaller (--hsdp {p.dp} is --zero 3)"
            )
        if next(self.strategies(), None) is None:
            why = (
                "no weight of the model is tensor-parallel, so every GPU must hold a pipeline stage or a "
                f"data-parallel share of the batch ({self.n_layers} blocks); give a larger batch, fewer "
                "GPUs, or --tp-layout auto"
                if self.allowed_tp == (1,) and p.tp is None
                else f"--tp {p.tp}"
                if p.tp is not None
                else f"tensor parallelism allowed: {', '.join(map(str, self.allowed_tp))}"
            )
            raise SpaceError(
                f"no strategy for {self.devices} devices, batch {self.batch} and these pins ({why})"
            )

    def _check_degree_product(self) -> None:
        """Pinned degrees whose product does not divide the cluster's GPUs (or, all of d, t, c and
        p pinned, is not their number: a strategy uses every GPU) are refused naming the product."""
        p = self.pins
        pinned = [
            (name, x) for name, x in (("dp", p.dp), ("tp", p.tp), ("cp", p.cp), ("pp", p.pp)) if x is not None
        ]
        if len(pinned) < 2:
            return
        n = math.prod(x for _, x in pinned)
        named = " × ".join(f"--{name} {x}" for name, x in pinned)
        # context parallelism not searched here is c = 1: d, t and p pinned are then every degree
        every = len(pinned) == 4 or (len(pinned) == 3 and p.cp is None and self.context_degrees() == [1])
        if self.devices % n or (every and n != self.devices):
            unsearched = ", c = 1: no context parallelism searched" if every and len(pinned) == 3 else ""
            raise SpaceError(
                f"{named} = {n:,} GPUs, but a strategy uses every one of the cluster's {self.devices:,} "
                f"(d·t·c·p = {self.devices:,}{unsearched})"
            )

    def _check_microbatch_pins(self) -> None:
        """``--microbatch-size``, ``-k`` (and their product) must divide the batch, or each
        replica's share of it under ``--dp``: refused naming the sizes that do."""
        p = self.pins
        per = self.batch // p.dp if p.dp is not None else self.batch
        where = f"the batch {per} per replica of --dp {p.dp}" if p.dp is not None else f"the batch {per}"
        do = ", ".join(map(str, _divisors_fast(per)))
        if p.mbs is not None and per % p.mbs:
            why = f"--microbatch-size {p.mbs} does not divide {where}"
            raise SpaceError(f"{why} (microbatch sizes that do: {do})")
        if p.k is not None and per % p.k:
            raise SpaceError(f"-k {p.k} does not divide {where} (microbatch counts that do: {do})")
        if p.mbs is not None and p.k is not None and per % (p.mbs * p.k):
            raise SpaceError(
                f"--microbatch-size {p.mbs} × -k {p.k} = {p.mbs * p.k} samples does not divide {where}: "
                f"a replica's k microbatches hold its share of the batch"
            )

    def why_not(self, d: int, t: int, p: int, c: int = 1) -> str | None:
        """Why the space has no strategy of shape (d, t, p) (and context parallelism c), in words
        (``None``: exactly when ``strategies`` yields some); the conditions of ``triples``,
        ``bases`` and ``ladder``."""
        pins = self.pins
        for name, x, pin in (("dp", d, pins.dp), ("tp", t, pins.tp), ("pp", p, pins.pp), ("cp", c, pins.cp)):
            if pin is not None and x != pin:
                return f"--{name} {pin} is pinned"
        if c not in self.context_degrees():
            return (
                f"c = {c} is not searched here (context parallelism needs a sequence of at least "
                f"{CP_MIN_SEQ} positions, cut into 2c chunks of at least {CP_MIN_CHUNK}, or --cp)"
            )
        if d * t * c * p != self.devices:
            what = "d·t·p" if c == 1 else "d·t·c·p"
            return f"{what} = {d * t * c * p}, not the cluster's {self.devices} devices"
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
        if pins.mbs is not None and per_replica % pins.mbs:
            return f"--microbatch-size {pins.mbs} does not divide the per-replica batch {per_replica}"
        if not self.microbatches(per_replica):
            return f"no microbatch of the per-replica batch {per_replica} fits the pins (k ≤ {pins.max_k})"
        sched = pins.schedule
        if p == 1 and sched not in (None, "1f1b", "gpipe"):
            return f"--schedule {sched} needs a pipeline (p > 1)"
        if p > 1 and not self.train and sched not in (None, "1f1b"):
            return f"inference runs its pipeline in 1f1b order, not --schedule {sched}"
        bases = [b for b in self.bases() if (b.d, b.t, b.p, b.c) == (d, t, p, c)]
        if not bases:
            if sched == "interleaved" and 2 * p > self.n_layers:
                return f"--schedule interleaved needs 2·p = {2 * p} blocks, the model has {self.n_layers}"
            if sched == "interleaved":
                return f"--schedule interleaved needs k a multiple of p = {p}, and no such k is allowed"
            return "no microbatch count and schedule of this shape fits the pins"
        if not any(self.ladder(b) for b in bases):
            if d == 1:
                return "ZeRO and HSDP pins need data parallelism (d > 1)"
            return f"--hsdp {pins.hsdp} must divide d = {d} and be smaller"
        return None

    def context_degrees(self) -> list[int]:
        """The context-parallel degrees searched (module docstring): the pin, else 1 and, for a
        sequence of at least ``pins.cp_from_seq`` (``CP_MIN_SEQ``), every divisor c of the
        devices whose 2c chunks hold ``CP_MIN_CHUNK`` positions or more."""
        if self.pins.cp is not None:
            return [self.pins.cp]
        if not self.train or self.seq < self.pins.cp_from_seq or self.no_context:
            return [1]
        return [
            c
            for c in divisors(self.devices)
            if c == 1 or (self.seq % (2 * c) == 0 and self.seq // (2 * c) >= CP_MIN_CHUNK)
        ]

    def triples(self, c: int = 1) -> Iterator[tuple[int, int, int]]:
        """The (d, t, p) of the space's strategies with context parallelism ``c``."""
        p = self.pins
        if self.devices % c:
            return
        n = self.devices // c
        for t in self.allowed_tp:
            if n % t or (p.tp is not None and t != p.tp):
                continue
            for pp in divisors(n // t):
                d = n // (t * pp)
                if (p.pp is not None and pp != p.pp) or (p.dp is not None and d != p.dp):
                    continue
                if pp > self.n_layers or self.batch % d:
                    continue
                yield d, t, pp

    def microbatches(self, per_replica: int) -> list[int]:
        """The gradient-accumulation steps k of a replica's ``per_replica`` samples: one per
        microbatch size b = per_replica / k (largest microbatch first), k ≤ ``max_k``, under
        the ``-k`` and ``--microbatch-size`` pins (a pinned k may exceed ``max_k``)."""
        pins = self.pins
        out = []
        for k in divisors(per_replica):
            if pins.k is not None and k != pins.k:
                continue
            if pins.mbs is not None and k * pins.mbs != per_replica:
                continue
            if k > pins.max_k and pins.k is None and pins.mbs is None:
                continue
            out.append(k)
        return out

    def bases(self) -> Iterator[Strategy]:
        """Every (d, t, c, sp, p, k, schedule, v), with ZeRO 0 and no recomputation."""
        pins = self.pins
        for c in self.context_degrees():
            for d, t, pp in self.triples(c):
                sps = [False, True] if t > 1 and self.sequence else [False]
                for sp in sps if pins.sp is None else [pins.sp] if pins.sp in sps else []:
                    yield from self._bases(d, t, pp, sp, c)

    def _bases(self, d: int, t: int, pp: int, sp: bool, c: int) -> Iterator[Strategy]:
        """``bases`` of one shape."""
        pins = self.pins
        for k in self.microbatches(self.batch // d):
            if pp == 1:
                scheds = [(pins.schedule or "1f1b", 1)] if pins.schedule in (None, "1f1b", "gpipe") else []
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
                yield Strategy(d=d, t=t, p=pp, k=k, schedule=name, v=v, sp=sp, c=c)

    def strategies(self) -> Iterator[Strategy]:
        """Every strategy of the space: each base's ladder."""
        for base in self.bases():
            yield from self.ladder(base)

    def shard_group(self, base: Strategy) -> int | None:
        """The HSDP shard group of ``base``'s ZeRO-3 rungs: the ``--hsdp`` pin, else the replicas
        of one node (node_devices / t) when a stage's replicas span more than a node; None when
        there is none (it must divide d and be between 2 and d − 1)."""
        h = self.pins.hsdp
        per = base.t * base.c  # the GPUs of one replica
        if h is None and self.node_devices and base.d * per > self.node_devices:
            h = self.node_devices // per if self.node_devices % per == 0 else None
        if h is None or h < 2 or h >= base.d or base.d % h:
            return None
        return h

    def ladder(self, base: Strategy) -> list[Strategy]:
        """The memory-saving variants of ``base``, cheapest first (module docstring); a pinned
        recomputation outside the ladder (``ops``) takes the place of selective."""
        if not self.train:
            return [base]
        return [rung.of(base) for rung in self.rungs(base)]

    def rungs(self, base: Strategy) -> list[Rung]:
        """What each strategy of ``ladder(base)`` changes of ``base``, in its order (a rung's
        strategy is made when asked: ``Rung.of``)."""
        pins = self.pins
        if not self.train:
            return [Rung(base.zero, base.recompute, base.shard_group)]
        rungs = list(LADDER)
        if pins.recompute is not None and all(r != pins.recompute for _, r in LADDER):
            rungs = [(z, pins.recompute) for z, r in LADDER if r == "selective"]
        h = self.shard_group(base)
        out: list[Rung] = []
        for zero, rec in rungs:
            if (pins.zero is not None and zero != pins.zero) or (
                pins.recompute is not None and rec != pins.recompute
            ):
                continue
            if zero and base.d * base.c == 1:
                continue
            if zero == 1 and pins.zero is None and base.p > 1 and base.k > 1:
                continue  # ZeRO-2 holds as much and reduces less (module docstring)
            groups: list[int | None] = [None]
            if zero == 3:
                groups = [h] if pins.hsdp is not None else [h, None] if h is not None else [None]
            for g in groups:
                if pins.hsdp is not None and g is None:
                    continue
                out.append(Rung(zero, rec, g))
        return out


class Rung(NamedTuple):
    """A rung of a memory ladder (``Space.rungs``): the ZeRO stage, recomputation and HSDP shard
    group it runs its base with."""

    zero: int
    recompute: str
    shard_group: int | None

    def of(self, base: Strategy) -> Strategy:
        """``base`` on this rung."""
        return replace(base, zero=self.zero, recompute=self.recompute, shard_group=self.shard_group)


__all__ = ["LADDER", "RECOMPUTES", "Pins", "Rung", "Space", "SpaceError", "divisors"]
