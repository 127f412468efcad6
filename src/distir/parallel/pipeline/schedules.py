"""Pipeline schedules as per-rank action lists (pure Python, no IR).

A pipeline of ``S = p * v`` *virtual* stages runs on ``p`` ranks; virtual stage ``s`` lives on
rank ``s % p`` (``stage_of``), so with ``v > 1`` each rank holds ``v`` model chunks (Megatron's
interleaving). A schedule is ``list[list[Action]]``: rank ``r`` runs ``per_rank[r]`` in order.

An ``Action`` is one pass of one microbatch through one virtual stage, written as PyTorch's
pipelining writes it: ``"0F1"`` is stage 0's forward of microbatch 1, ``"1B0"`` stage 1's full
backward of microbatch 0; a zero-bubble schedule splits the backward into ``"0I1"`` (gradient of
the input, on the critical path) and ``"0W1"`` (gradient of the weights, deferrable).
``format_schedule`` writes one line per rank (``rank 0: 0F0 0F1 0B0 ...``); ``parse_schedule`` is
its exact inverse and reports malformed text as ``ScheduleError`` with (rank, index, token).

Builders (``build_schedule(name, p, k, v)``): ``gpipe``, ``1f1b``, ``interleaved`` (``i1f1b``),
``zb1`` (``zbh1``). Checking, merging into one global order, simulation and in-flight counts are
in ``distir.parallel.pipeline.analysis``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

Kind: TypeAlias = Literal["F", "B", "I", "W"]
KINDS: tuple[Kind, ...] = ("F", "B", "I", "W")


class ScheduleError(ValueError):
    """A malformed action/schedule text, bad builder arguments, or an invalid schedule.

    ``rank``, ``index`` (position in that rank's list) and ``token`` locate the problem when it
    has a position; they are ``None`` otherwise.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        index: int | None = None,
        token: str | None = None,
    ) -> None:
        where = []
        if rank is not None:
            where.append(f"rank {rank}")
        if index is not None:
            where.append(f"index {index}")
        if token is not None:
            where.append(f"token {token!r}")
        super().__init__(f"{message} (at {', '.join(where)})" if where else message)
        self.rank = rank
        self.index = index
        self.token = token


@dataclass(frozen=True, slots=True)
class Action:
    """One pass: ``kind`` of ``microbatch`` through virtual ``stage``. ``str`` gives ``"0F1"``."""

    stage: int
    microbatch: int
    kind: Kind

    def __post_init__(self) -> None:
        stage, mb = self.stage, self.microbatch
        if type(stage) is int and type(mb) is int and stage >= 0 <= mb and self.kind in KINDS:
            return  # the builders' actions: every check below passes
        if self.kind not in KINDS:
            raise ScheduleError(f"action kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for field, val in (("stage", self.stage), ("microbatch", self.microbatch)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise ScheduleError(f"action {field} must be an int >= 0, got {val!r}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


# Numbers are canonical (no leading zeros) so that text round-trips exactly.
_ACTION_RE = re.compile(r"(0|[1-9][0-9]*)([FBIW])(0|[1-9][0-9]*)")
_HEADER_RE = re.compile(r"rank (0|[1-9][0-9]*):")


def parse_action(token: str, *, rank: int | None = None, index: int | None = None) -> Action:
    """Parse ``"<stage><kind><microbatch>"`` (e.g. ``"2F13"``); ``ScheduleError`` otherwise."""
    m = _ACTION_RE.fullmatch(token)
    if m is None:
        raise ScheduleError(
            "malformed action: expected <stage><F|B|I|W><microbatch> with decimal numbers "
            "without leading zeros, e.g. '0F1'",
            rank=rank,
            index=index,
            token=token,
        )
    kind: Kind = m.group(2)  # type: ignore[assignment]  # the regex admits only F, B, I, W
    return Action(int(m.group(1)), int(m.group(3)), kind)


def format_schedule(per_rank: Sequence[Sequence[Action]]) -> str:
    """One line per rank, ``rank <r>:`` then the actions separated by single spaces."""
    return "\n".join(f"rank {r}:" + "".join(f" {a}" for a in acts) for r, acts in enumerate(per_rank))


def parse_schedule(text: str) -> list[list[Action]]:
    """Inverse of ``format_schedule``. Lines are ``rank <r>: <action> ...`` with ranks 0, 1, ...
    in order; blank lines (e.g. a trailing newline) are skipped. Errors name rank/index/token."""
    per_rank: list[list[Action]] = []
    for line in text.split("\n"):
        if not line.strip():
            continue
        head, sep, rest = line.partition(":")
        r = len(per_rank)
        m = _HEADER_RE.fullmatch(head + sep)
        if m is None:
            raise ScheduleError(f"expected a line starting 'rank {r}:'", rank=r, token=line)
        if int(m.group(1)) != r:
            raise ScheduleError(f"ranks must be listed in order: expected rank {r}", rank=r, token=head)
        if rest and not rest.startswith(" "):
            raise ScheduleError("expected a space after 'rank <r>:'", rank=r, token=rest)
        tokens = rest.split(" ")[1:] if rest else []
        per_rank.append([parse_action(t, rank=r, index=i) for i, t in enumerate(tokens)])
    return per_rank


# ---------------------------------------------------------------------------------------------
# Placement


def num_stages(p: int, v: int) -> int:
    """Number of virtual stages of ``p`` ranks holding ``v`` chunks each."""
    _check_counts(p=p, v=v)
    return p * v


def stage_of(virtual_stage: int, p: int) -> int:
    """The rank that runs ``virtual_stage`` (round-robin: ``virtual_stage % p``)."""
    _check_counts(p=p)
    if virtual_stage < 0:
        raise ScheduleError(f"virtual stage must be >= 0, got {virtual_stage}")
    return virtual_stage % p


def _check_counts(**counts: int) -> None:
    for name, val in counts.items():
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ScheduleError(f"{name} must be an int >= 1, got {val!r}")


# ---------------------------------------------------------------------------------------------
# Builders


def gpipe(p: int, k: int) -> list[list[Action]]:
    """GPipe: every rank runs all ``k`` forwards, then all ``k`` backwards, both in microbatch
    order 0..k-1 (as ``torch.distributed.pipelining.ScheduleGPipe``; the GPipe paper draws the
    backwards last-first, which takes the same time for uniform pass times)."""
    _check_counts(p=p, k=k)
    return [[Action(r, m, "F") for m in range(k)] + [Action(r, m, "B") for m in range(k)] for r in range(p)]


def _one_f_one_b_rank(p: int, k: int, r: int) -> list[Action]:
    warmup = min(p - 1 - r, k)
    acts = [Action(r, m, "F") for m in range(warmup)]
    for m in range(k - warmup):  # steady state: the next forward, then the oldest backward
        acts += [Action(r, warmup + m, "F"), Action(r, m, "B")]
    acts += [Action(r, m, "B") for m in range(k - warmup, k)]
    return acts


def one_f_one_b(p: int, k: int) -> list[list[Action]]:
    """1F1B (PipeDream-flush): rank ``r`` runs ``min(p-1-r, k)`` warm-up forwards, then alternates
    one forward and one backward (oldest microbatch first), then the remaining backwards. At most
    ``min(k, p-r)`` microbatches are in flight on rank ``r``."""
    _check_counts(p=p, k=k)
    return [_one_f_one_b_rank(p, k, r) for r in range(p)]


def interleaved_1f1b(p: int, k: int, v: int) -> list[list[Action]]:
    """Megatron-LM's interleaved 1F1B with ``v`` chunks per rank (chunk ``c`` of rank ``r`` is
    virtual stage ``c*p + r``). Requires ``k % p == 0`` when ``v > 1`` (Megatron's constraint).

    Each rank runs ``k*v`` "virtual microbatches". Virtual index ``i`` belongs to group
    ``i // (p*v)``; within a group, forwards go chunk by chunk, ``p`` microbatches each
    (chunk ``(i % (p*v)) // p``, microbatch ``(i // (p*v))*p + i % p``), and backwards use the
    chunks in reverse order. Rank ``r`` runs ``min(k*v, 2*(p-r-1) + (v-1)*p)`` warm-up forwards,
    then alternates forward ``i + warmup`` and backward ``i``, then the remaining backwards.
    (Megatron runs everything as warm-up when ``k == p``; this keeps the formula there too, so
    the in-flight count stays bounded by it.) With ``v == 1`` this is ``one_f_one_b`` — Megatron
    runs the plain 1F1B schedule when there is no virtual pipeline.
    """
    _check_counts(p=p, k=k, v=v)
    if v == 1:
        return one_f_one_b(p, k)
    if k % p != 0:
        raise ScheduleError(
            f"interleaved 1F1B needs the number of microbatches to be a multiple of p: "
            f"k={k}, p={p} (k % p = {k % p})"
        )
    total = k * v
    group = p * v

    def action(r: int, i: int, kind: Kind) -> Action:
        chunk = (i % group) // p
        if kind != "F":
            chunk = v - 1 - chunk
        return Action(chunk * p + r, (i // group) * p + i % p, kind)

    per_rank: list[list[Action]] = []
    for r in range(p):
        warmup = min(total, 2 * (p - r - 1) + (v - 1) * p)
        acts = [action(r, i, "F") for i in range(warmup)]
        for i in range(total - warmup):
            acts += [action(r, i + warmup, "F"), action(r, i, "B")]
        acts += [action(r, i, "B") for i in range(total - warmup, total)]
        per_rank.append(acts)
    return per_rank


def zero_bubble_h1(p: int, k: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §2.1 and Figure 3 top).

    Rank ``r`` runs the 1F1B order of forwards and backwards with each backward replaced by its
    input-gradient pass ``I``; the weight-gradient passes ``W`` are deferred: right after an
    ``I``, rank ``r`` runs the oldest pending ``W`` once more than ``r`` are pending, and it runs
    the ones left at the end. So rank 0 runs ``W`` right after ``I`` and the last rank keeps
    ``p-1`` pending, which fill the cool-down bubbles of 1F1B (the paper's ``(p-i+1) M_B +
    (i-1) M_W`` memory of worker ``i``). Forwards and ``I`` passes keep the 1F1B order, so the
    peak number of microbatches between F and I equals 1F1B's, ``min(k, p-r)``.
    """
    _check_counts(p=p, k=k)
    per_rank: list[list[Action]] = []
    for r in range(p):
        acts: list[Action] = []
        pending: deque[int] = deque()
        for a in _one_f_one_b_rank(p, k, r):
            if a.kind == "F":
                acts.append(a)
                continue
            acts.append(Action(r, a.microbatch, "I"))
            pending.append(a.microbatch)
            if len(pending) > r:
                acts.append(Action(r, pending.popleft(), "W"))
        acts += [Action(r, m, "W") for m in pending]
        per_rank.append(acts)
    return per_rank


_BUILDERS: dict[str, Callable[[int, int, int], list[list[Action]]]] = {
    "gpipe": lambda p, k, v: gpipe(p, k),
    "1f1b": lambda p, k, v: one_f_one_b(p, k),
    "interleaved": interleaved_1f1b,
    "zb1": lambda p, k, v: zero_bubble_h1(p, k),
}
_ALIASES = {"i1f1b": "interleaved", "zbh1": "zb1"}
SCHEDULE_NAMES: tuple[str, ...] = (*_BUILDERS, *_ALIASES)

# Schedules whose backward is split into I and W passes.
SPLIT_BACKWARD = frozenset({"zb1"})


def canonical_name(name: str) -> str:
    """The builder name behind ``name`` or an alias; ``ScheduleError`` listing the known names."""
    canon = _ALIASES.get(name, name)
    if canon not in _BUILDERS:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULE_NAMES)}")
    return canon


def build_schedule(name: str, p: int, k: int, v: int = 1) -> list[list[Action]]:
    """Build a schedule by name (``gpipe``, ``1f1b``, ``interleaved``/``i1f1b``, ``zb1``/``zbh1``).
    ``v`` (chunks per rank) applies to ``interleaved`` only; other names require ``v == 1``."""
    canon = canonical_name(name)
    _check_counts(p=p, k=k, v=v)
    if canon != "interleaved" and v != 1:
        raise ScheduleError(f"schedule {name!r} has one chunk per rank: v must be 1, got {v}")
    return _BUILDERS[canon](p, k, v)
