"""DeepSpeed's TrainSchedule (``distir.parallel.pipeline.deepspeed``).

1. Each stage's instructions equal what DeepSpeed's own ``TrainSchedule``
   (``deepspeed/runtime/pipe/schedule.py`` at 38327e0) yields for small (p, k): the lists below
   were printed by running that file, step by step (``step:instruction microbatch``; ``sA``
   SendActivation, ``rA`` RecvActivation, ``sG`` SendGrad, ``rG`` RecvGrad).
2. Its passes, stage by stage, are Megatron-LM's 1F1B order (the same warm-up forwards, then one
   forward and one backward): DeepSpeed differs in its transfers only.
3. ``step_order`` keeps every stage's own order, each transfer seen by both stages.
"""

from __future__ import annotations

import pytest

from distir.parallel.pipeline.deepspeed import Instruction, step_order, train_schedule
from distir.parallel.pipeline.schedules import ScheduleError, one_f_one_b

_SHORT = {
    "SendActivation": "sA",
    "RecvActivation": "rA",
    "SendGrad": "sG",
    "RecvGrad": "rG",
    "F": "F",
    "B": "B",
}

# printed from DeepSpeed's TrainSchedule(micro_batches=k, stages=p, stage_id=s).steps()
DEEPSPEED = {
    (3, 4): [
        "0:F0 1:sA0 2:F1 3:sA1 4:F2 5:rG0 5:sA2 5:B0 6:F3 7:rG1 7:sA3 7:B1 9:rG2 9:B2 11:rG3 11:B3",
        "1:rA0 1:F0 2:sA0 3:rA1 3:F1 4:rG0 4:sA1 4:B0 5:sG0 5:rA2 5:F2 6:rG1 6:sA2 6:B1 7:sG1 7:rA3 "
        "7:F3 8:rG2 8:sA3 8:B2 9:sG2 10:rG3 10:B3 11:sG3",
        "2:rA0 2:F0 3:B0 4:sG0 4:rA1 4:F1 5:B1 6:sG1 6:rA2 6:F2 7:B2 8:sG2 8:rA3 8:F3 9:B3 10:sG3",
    ],
    (4, 6): [
        "0:F0 1:sA0 2:F1 3:sA1 4:F2 5:sA2 6:F3 7:rG0 7:sA3 7:B0 8:F4 9:rG1 9:sA4 9:B1 10:F5 11:rG2 "
        "11:sA5 11:B2 13:rG3 13:B3 15:rG4 15:B4 17:rG5 17:B5",
        "1:rA0 1:F0 2:sA0 3:rA1 3:F1 4:sA1 5:rA2 5:F2 6:rG0 6:sA2 6:B0 7:sG0 7:rA3 7:F3 8:rG1 8:sA3 "
        "8:B1 9:sG1 9:rA4 9:F4 10:rG2 10:sA4 10:B2 11:sG2 11:rA5 11:F5 12:rG3 12:sA5 12:B3 13:sG3 "
        "14:rG4 14:B4 15:sG4 16:rG5 16:B5 17:sG5",
        "2:rA0 2:F0 3:sA0 4:rA1 4:F1 5:rG0 5:sA1 5:B0 6:sG0 6:rA2 6:F2 7:rG1 7:sA2 7:B1 8:sG1 8:rA3 "
        "8:F3 9:rG2 9:sA3 9:B2 10:sG2 10:rA4 10:F4 11:rG3 11:sA4 11:B3 12:sG3 12:rA5 12:F5 13:rG4 "
        "13:sA5 13:B4 14:sG4 15:rG5 15:B5 16:sG5",
        "3:rA0 3:F0 4:B0 5:sG0 5:rA1 5:F1 6:B1 7:sG1 7:rA2 7:F2 8:B2 9:sG2 9:rA3 9:F3 10:B3 11:sG3 "
        "11:rA4 11:F4 12:B4 13:sG4 13:rA5 13:F5 14:B5 15:sG5",
    ],
}


def _text(instrs: list[Instruction]) -> str:
    return " ".join(f"{i.step}:{_SHORT[i.kind]}{i.microbatch}" for i in instrs)


@pytest.mark.parametrize(("p", "k"), sorted(DEEPSPEED))
def test_each_stage_runs_deepspeeds_train_schedule(p: int, k: int) -> None:
    assert [_text(x) for x in train_schedule(p, k)] == DEEPSPEED[(p, k)]


@pytest.mark.parametrize("p", range(1, 8))
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 13])
def test_passes_are_megatrons_1f1b_order(p: int, k: int) -> None:
    for s, (ds, mg) in enumerate(zip(train_schedule(p, k), one_f_one_b(p, k), strict=True)):
        assert [(i.kind, i.microbatch) for i in ds if i.kind in ("F", "B")] == [
            (a.kind, a.microbatch) for a in mg
        ], s


def _seen_by_stages(p: int, k: int) -> list[list[tuple[str, int]]]:
    """``step_order`` projected onto each stage, transfers as the sender and receiver see them."""
    per: list[list[tuple[str, int]]] = [[] for _ in range(p)]
    for send, a in step_order(p, k):
        if not send:
            per[a.stage].append((a.kind, a.microbatch))
        elif a.kind == "F":  # the activation a.stage made, to the next stage
            per[a.stage].append(("SendActivation", a.microbatch))
            per[a.stage + 1].append(("RecvActivation", a.microbatch))
        else:  # the input gradient a.stage made, to the previous stage
            per[a.stage].append(("SendGrad", a.microbatch))
            per[a.stage - 1].append(("RecvGrad", a.microbatch))
    return per


@pytest.mark.parametrize(("p", "k"), [(1, 3), (2, 2), (3, 4), (4, 6), (5, 3), (6, 11)])
def test_program_order_keeps_every_stage_order(p: int, k: int) -> None:
    expected = [[(i.kind, i.microbatch) for i in instrs] for instrs in train_schedule(p, k)]
    assert _seen_by_stages(p, k) == expected


@pytest.mark.parametrize(("p", "k"), [(0, 2), (2, 0), (True, 2)])
def test_bad_counts_are_refused(p: int, k: int) -> None:
    with pytest.raises(ScheduleError, match="must be an int >= 1"):
        train_schedule(p, k)
