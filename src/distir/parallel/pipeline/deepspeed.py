"""DeepSpeed's ``TrainSchedule`` as instruction lists (pure Python, no IR).

DeepSpeed's ``PipelineEngine`` (``deepspeed/runtime/pipe/engine.py``) runs the instructions its
``TrainSchedule`` (``deepspeed/runtime/pipe/schedule.py``) yields, one *step* at a time, and
every pipeline transfer is a blocking ``dist.send``/``dist.recv`` (``p2p.py``). The schedule is a
lock-step 1F1B of its own: ``2·(k + p − 1)`` steps; in step ``t`` stage ``s`` runs a forward if
``t`` and ``s`` have the same parity, else a backward, of microbatch

- forward: ``t // 2 − s // 2``;
- backward: ``t // 2 − p + 1 + s // 2``;

and nothing when that microbatch is not in ``0 .. k−1``. A step begins with the transfers of
the stage's previous step's result and of the current step's input: a forward step sends the
gradient of the previous (backward) step's microbatch to stage ``s − 1``
(``SendGrad``) and then receives this step's activation from it (``RecvActivation``); a backward
step receives this step's gradient from stage ``s + 1`` (``RecvGrad``) and then sends the
previous (forward) step's activation to it (``SendActivation``). So in each step a stage
exchanges with one neighbour, both transfers in the same order on both sides, and a forward's
result leaves only at the start of the stage's next step, after its ``RecvGrad``: each step of a
pair ends when the slower of the two passes ends, so the steady state takes ``2·max(F, B)`` per
microbatch, not Megatron-LM's ``F + B``.

``train_schedule(p, k)`` gives each stage's instructions in the order the engine runs them;
``step_order(p, k)`` merges them into one program order (steps in order; within a step every
transfer, then every pass), which keeps each stage's own order."""

from __future__ import annotations

from typing import Literal, NamedTuple, TypeAlias

from distir.parallel.pipeline.schedules import Action, ScheduleError

Instr: TypeAlias = Literal["F", "B", "SendGrad", "RecvActivation", "RecvGrad", "SendActivation"]


class Instruction(NamedTuple):
    """One instruction of stage ``stage`` in step ``step``: a pass (``F``/``B``) or a transfer,
    on ``microbatch``."""

    step: int
    stage: int
    kind: Instr
    microbatch: int


def _microbatch(t: int, s: int, p: int) -> tuple[int, bool]:
    """(microbatch, is a forward) of stage ``s`` in step ``t`` (module docstring)."""
    if t % 2 == s % 2:
        return t // 2 - s // 2, True
    return t // 2 - p + 1 + s // 2, False


def _stage_steps(p: int, k: int, s: int) -> list[Instruction]:
    out: list[Instruction] = []
    prev = -1
    for t in range(2 * (k + p - 1)):
        m, fwd = _microbatch(t, s, p)
        ok, prev_ok = 0 <= m < k, 0 <= prev < k
        if fwd and s > 0:
            out += [Instruction(t, s, "SendGrad", prev)] if prev_ok else []
            out += [Instruction(t, s, "RecvActivation", m)] if ok else []
        elif not fwd and s < p - 1:
            out += [Instruction(t, s, "RecvGrad", m)] if ok else []
            out += [Instruction(t, s, "SendActivation", prev)] if prev_ok else []
        if ok:
            out.append(Instruction(t, s, "F" if fwd else "B", m))
        prev = m
    return out


def train_schedule(p: int, k: int) -> list[list[Instruction]]:
    """Each stage's ``TrainSchedule`` instructions (passes and transfers), in the engine's order."""
    for name, val in (("p", p), ("k", k)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ScheduleError(f"{name} must be an int >= 1, got {val!r}")
    return [_stage_steps(p, k, s) for s in range(p)]


class Event(NamedTuple):
    """One entry of the merged program order: ``send`` the result of ``action`` to the
    neighbouring stage (a blocking transfer, on both stages), or run ``action``."""

    send: bool
    action: Action


def step_order(p: int, k: int) -> list[Event]:
    """The program order of ``train_schedule(p, k)``: step by step, each step's transfers (each
    pair's gradient before its activation, as both stages issue them), then its passes. A
    transfer is named by the pass that made what it carries (``SendGrad`` of ``m``: stage ``s``'s
    backward of ``m``; ``SendActivation`` of ``m``: its forward of ``m``); receives are the same
    transfers seen from the other stage."""
    per_stage = train_schedule(p, k)
    steps = 2 * (k + p - 1)
    sends: list[list[Event]] = [[] for _ in range(steps)]
    passes: list[list[Event]] = [[] for _ in range(steps)]
    for instrs in per_stage:
        for ins in instrs:
            if ins.kind == "SendGrad":
                sends[ins.step].append(Event(True, Action(ins.stage, ins.microbatch, "B")))
            elif ins.kind == "SendActivation":
                sends[ins.step].append(Event(True, Action(ins.stage, ins.microbatch, "F")))
            elif ins.kind in ("F", "B"):
                passes[ins.step].append(Event(False, Action(ins.stage, ins.microbatch, ins.kind)))
    # a pair's gradient (sent by the upper stage) goes before its activation (sent by the lower)
    order: list[Event] = []
    for t in range(steps):
        order += sorted(sends[t], key=lambda e: (e.action.kind == "F", e.action.stage))
        order += passes[t]
    return order
