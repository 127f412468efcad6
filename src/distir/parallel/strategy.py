"""A distribution strategy as a value, with a compact string form.

``Strategy(d=2, t=4, p=2, k=8, schedule="1f1b")`` prints as ``d2.t4.p2.k8.1f1b``; optional parts
follow when they differ from the default, in this order (``sp`` and ``c<n>`` right after
``t<n>``, as in ``d2.t4.sp.c2.p2.k8.1f1b``; the other parts after the schedule):

    sp          sequence parallelism (Megatron-LM, Korthikanti et al. 2022) on the tensor-parallel
                axis: activations between layers sharded along the model's sequence dim; needs t > 1
    c<n>        context parallelism over n GPUs (after t/sp, as in ``d2.t1.c2.p1.k1``; default 1,
                not printed): the sequence split over a ``cp`` mesh axis in load-balanced
                chunks (``distir.parallel.context_model``; K/V all-gathered over cp);
                a stage's mesh is (dp=d, cp=c, tp=t)
    v<n>        virtual pipeline stages per rank (interleaved schedules), default 1
    z<0-3>      ZeRO stage, default 0
    z3h<n>      HSDP (hybrid sharding: FSDP's HYBRID_SHARD, torchtitan's data_parallel_shard_degree
                × data_parallel_replicate_degree): ZeRO-3 inside groups of n consecutive data-
                parallel replicas (with the default placement, the GPUs of a node when n·t is the
                node's size), replicated over the d/n groups — parameters, gradients and optimizer
                state sharded n ways, parameters all-gathered within the group, gradients
                reduce-scattered within it and all-reduced across groups; 1 < n < d, n divides d
    r<mode>     activation recomputation: none (default), full, sel (Megatron's selective: the
                attention core), ops (torchtitan's op-level: products saved, the rest recomputed)
    L<a>-<b>-…  repeated blocks per pipeline chunk (an explicit partition, e.g. L5-4-4-3; the
                embedding always joins the first chunk, head and loss the last, so those two
                may hold 0 blocks); Luniform (default) or Lparams (balance parameter counts)
    b<a>-<b>-…  batch shares of the d data-parallel replicas (uneven data parallelism, for
                replicas on GPUs of different speeds): replica r takes a_r/Σa of every
                microbatch; written in lowest terms, equal shares are the default (even)
    @<i>-<j>-…  device placement: the cluster devices that play program devices 0, 1, …

``parse_strategy`` is the exact inverse of ``str`` (round-trip tested) and raises
``StrategyError`` naming the offending part and what was expected.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import NamedTuple

from distir.limits import MAX_DEGREE, MAX_DEVICES, MAX_LAYERS, exceeds, is_digits, over, read_int

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb1")
_ALIASES = {"i1f1b": "interleaved", "zbh1": "zb1", "fill-drain": "gpipe"}
RECOMPUTE = {"none": "none", "full": "full", "sel": "selective", "selective": "selective", "ops": "ops"}
_RECOMPUTE_PART = {"full": "rfull", "selective": "rsel", "ops": "rops"}  # as a strategy string writes it


class StrategyError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Strategy:
    d: int = 1
    t: int = 1
    p: int = 1
    k: int = 1
    schedule: str = "1f1b"
    v: int = 1
    zero: int = 0
    recompute: str = "none"
    partition: tuple[int, ...] | str = "uniform"
    placement: tuple[int, ...] | None = None
    sp: bool = False
    shares: tuple[int, ...] | None = None  # per data-parallel replica (None: even)
    shard_group: int | None = None  # HSDP: ZeRO-3 over groups of this many replicas (None: all d)
    c: int = 1  # context parallelism (last, so positional construction keeps its meaning)

    def __post_init__(self) -> None:
        for f in ("d", "t", "p", "k", "v", "c"):
            x = getattr(self, f)
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise StrategyError(f"{f} must be a positive integer, got {x!r}")
            if exceeds(x, MAX_DEGREE):
                raise StrategyError(over(f, x, MAX_DEGREE))
        if exceeds(self.devices, MAX_DEVICES):
            raise StrategyError(over("d·c·t·p", self.devices, MAX_DEVICES))
        if not isinstance(self.sp, bool):
            raise StrategyError(f"sp must be True or False, got {self.sp!r}")
        if self.sp and self.t == 1:
            raise StrategyError(
                "sp (sequence parallelism) shards activations over the tensor-parallel group; it needs t > 1"
            )
        if self.schedule not in SCHEDULES:
            raise StrategyError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")
        if self.zero not in (0, 1, 2, 3):
            raise StrategyError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.shard_group is not None:
            h = self.shard_group
            if not isinstance(h, int) or isinstance(h, bool) or h < 2:
                raise StrategyError(f"the HSDP shard group must be an integer ≥ 2, got {h!r}")
            if self.zero != 3:
                raise StrategyError(f"an HSDP shard group (h{h}) shards ZeRO-3's state: it needs z3")
            if h >= self.d or self.d % h:
                raise StrategyError(
                    f"the HSDP shard group h{h} must divide d = {self.d} and be smaller (h = d is plain z3)"
                )
        if self.recompute not in ("none", "full", "selective", "ops"):
            raise StrategyError(f"recompute must be none, full, selective or ops, got {self.recompute!r}")
        if self.v > 1 and self.schedule != "interleaved":
            raise StrategyError(
                f"v={self.v} virtual stages need the interleaved schedule, not {self.schedule}"
            )
        if isinstance(self.partition, str):
            if self.partition not in ("uniform", "params"):
                raise StrategyError(
                    f"partition must be uniform, params or layer counts, got {self.partition!r}"
                )
        else:
            if len(self.partition) != self.p * self.v or any(n < 0 for n in self.partition):
                raise StrategyError(
                    f"partition {'-'.join(map(str, self.partition))} must give p·v = {self.p * self.v} "
                    "block counts"
                )
        if self.shares is not None:
            sh = self.shares
            if (
                not isinstance(sh, tuple)
                or len(sh) != self.d
                or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in sh)
            ):
                raise StrategyError(f"batch shares must be d = {self.d} positive integers, got {sh!r}")
            if self.zero:
                raise StrategyError("batch shares (uneven data parallelism) do not combine with ZeRO yet")
            g = math.gcd(*sh)
            # lowest terms, equal shares as None: one string per strategy
            object.__setattr__(self, "shares", None if len(set(sh)) == 1 else tuple(x // g for x in sh))
        if self.placement is not None and sorted(self.placement) != list(range(self.devices)):
            raise StrategyError(
                f"placement must be a permutation of 0..{self.devices - 1}, got {list(self.placement)}"
            )

    @property
    def devices(self) -> int:
        return self.d * self.c * self.t * self.p

    @property
    def zero_degree(self) -> int:
        """The ranks ZeRO shards over: the HSDP shard group, else all d replicas — times c, the
        context ranks of a replica holding the same weights (as Megatron-LM's distributed
        optimizer and torchtitan's FSDP over dp × cp)."""
        return (self.shard_group or self.d) * self.c

    @property
    def chunks(self) -> int:
        return self.p * self.v

    def training_parts(self) -> list[str]:
        """The parts only a training step has, named with their strategy-string part: ZeRO-1/2's
        sharded optimizer state, recomputation for the backward, the zero-bubble schedule's split
        backward. An inference program would ignore them, so ``--infer`` refuses them (ZeRO-3's
        sharded weights and microbatches run in inference too)."""
        return [
            *([f"ZeRO-{self.zero} (z{self.zero})"] if self.zero in (1, 2) else []),
            *([f"recomputation ({_RECOMPUTE_PART[self.recompute]})"] if self.recompute != "none" else []),
            *(["the zero-bubble schedule (zb1)"] if self.schedule == "zb1" else []),
        ]

    @property
    def gpus(self) -> tuple[int, ...]:
        """The cluster GPU of each program device: the placement, else GPU i for device i."""
        return self.placement or tuple(range(self.devices))

    def __str__(self) -> str:
        parts = [f"d{self.d}", f"t{self.t}", *(["sp"] if self.sp else [])]
        parts += [*([f"c{self.c}"] if self.c != 1 else []), f"p{self.p}", f"k{self.k}"]
        parts.append(self.schedule)
        if self.v != 1:
            parts.append(f"v{self.v}")
        if self.zero:
            parts.append(f"z{self.zero}" + (f"h{self.shard_group}" if self.shard_group else ""))
        if self.recompute != "none":
            parts.append(_RECOMPUTE_PART[self.recompute])
        if self.partition != "uniform":
            parts.append(
                "L"
                + (self.partition if isinstance(self.partition, str) else "-".join(map(str, self.partition)))
            )
        if self.shares is not None:
            parts.append("b" + "-".join(map(str, self.shares)))
        if self.placement is not None:
            parts.append("@" + "-".join(map(str, self.placement)))
        return ".".join(parts)


def _int(part: str, text: str, what: str) -> int:
    value = read_int(part[1:])
    if value is None:
        raise StrategyError(f"strategy {text!r}: {part!r} should be {what} (like {part[0]}2)")
    return value


def _ints(body: str, part: str, text: str) -> tuple[int, ...]:
    items = body.split("-")
    values = [read_int(x) for x in items]
    if len(items) > MAX_DEVICES.max or any(v is None for v in values):
        raise StrategyError(f"strategy {text!r}: {part!r} should list integers separated by '-'")
    bound = MAX_LAYERS if part[0] == "L" else MAX_DEGREE
    big = max(v for v in values if v is not None)
    if exceeds(big, bound):
        raise StrategyError(f"strategy {text!r}: {over(f'an entry of {part[0]}…', big, bound)}")
    return tuple(v for v in values if v is not None)


class _Part(NamedTuple):
    """One dot-separated part of a strategy string read: the field it sets and its value, and
    any further field it sets too (``z3h8``: the HSDP shard group)."""

    key: str
    value: object
    extra: dict[str, object]


_KNOWN_PARTS = (
    "d<n>",
    "t<n>",
    "sp",
    "c<n>",
    "p<n>",
    "k<n>",
    "v<n>",
    "z<0-3>",
    "z3h<n>",
    "rnone|rfull|rsel|rops",
    "L…",
    "b…",
    "@…",
    *SCHEDULES,
)


def _hsdp_part(part: str, text: str) -> _Part:
    """``z3h<n>``: ZeRO stage and HSDP shard group."""
    stage, _, h = part[1:].partition("h")
    zs, hs = read_int(stage), read_int(h)
    if zs is None or hs is None:
        raise StrategyError(f"strategy {text!r}: {part!r} should be z3h<n> (HSDP, like z3h8)")
    return _Part("zero", zs, {"shard_group": hs})


def _unknown_part(part: str, text: str) -> StrategyError:
    close = difflib.get_close_matches(part, [*SCHEDULES, *_ALIASES, "sp"], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return StrategyError(f"strategy {text!r}: unknown part {part!r}{hint}; parts: {', '.join(_KNOWN_PARTS)}")


def _read_part(part: str, text: str) -> _Part:
    """One non-empty part of strategy ``text`` (module docstring), or a ``StrategyError``."""
    name = _ALIASES.get(part, part)
    head, body = part[0], part[1:]
    if name in SCHEDULES:
        return _Part("schedule", name, {})
    if part == "sp":
        return _Part("sp", True, {})
    if head in "dtpkvc" and is_digits(body):
        return _Part(head, _int(part, text, "a positive integer"), {})
    if head == "z":
        return (
            _hsdp_part(part, text) if "h" in part else _Part("zero", _int(part, text, "a ZeRO stage 0-3"), {})
        )
    if head == "r" and body in RECOMPUTE:
        return _Part("recompute", RECOMPUTE[body], {})
    if head == "L":
        return _Part("partition", body if body in ("uniform", "params") else _ints(body, part, text), {})
    if head == "@":
        return _Part("placement", _ints(body, part, text), {})
    if head == "b" and is_digits(part[1:2]):
        return _Part("shares", _ints(body, part, text), {})
    raise _unknown_part(part, text)


def parse_strategy(text: str) -> Strategy:
    """``"d2.t4.p2.k8.1f1b"`` -> Strategy (module docstring)."""
    fields: dict[str, object] = {}
    if not text.strip():
        raise StrategyError("empty strategy; expected something like d2.t4.p2.k8.1f1b")
    for part in text.strip().split("."):
        if not part:
            raise StrategyError(f"strategy {text!r}: empty part (two dots in a row?)")
        got = _read_part(part, text)
        fields.update(got.extra)
        if got.key in fields:
            raise StrategyError(f"strategy {text!r}: {got.key} is given twice")
        fields[got.key] = got.value
    try:
        return Strategy(**fields)  # type: ignore[arg-type]
    except StrategyError as e:
        raise StrategyError(f"strategy {text!r}: {e}") from None
