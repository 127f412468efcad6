"""``distir.sim.summary.summary_table``: a row per slot that ran something, and above
``MERGE_ROWS_ABOVE`` of them one row per set of slots whose figures print alike."""

from __future__ import annotations

import io

from rich.console import Console

from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import SimResult, simulate
from distir.sim.summary import MERGE_ROWS_ABOVE, summary_table


def _simulated(strategy: str, nodes: int, batch: int) -> SimResult:
    s = parse_strategy(strategy)
    m = distribute(build_model("gpt:layers=2,hidden=128,heads=4", batch=batch), s, comm_streams=True)
    return simulate(m, parse_cluster(f"dgx-a100:{nodes}"), device_map(s, True), batch=batch)


def _rendered(r: SimResult) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=200).print(summary_table(r, "t"))
    return [line for line in out.getvalue().splitlines() if line.startswith("│")]


def _ran(r: SimResult) -> list[int]:
    """The slots that ran something: every compute stream, the others with busy or comm time."""
    return [i for i, s in enumerate(r.slots) if s.stream == "compute" or r.busy_s[i] or r.comm_s[i]]


def test_a_small_program_has_a_row_per_slot_that_ran_something() -> None:
    r = _simulated("d2.t1.p2.k2.1f1b", 1, 8)
    assert len(r.slots) <= MERGE_ROWS_ABOVE
    ran = _ran(r)
    assert len(ran) < len(r.slots)  # its pipeline's send streams only wait
    assert len(_rendered(r)) == len(ran)


def test_a_large_program_shares_rows_and_names_every_device_once() -> None:
    r = _simulated("d64.t1.p2.k2.1f1b", 16, 128)
    assert len(_ran(r)) > MERGE_ROWS_ABOVE
    rows = _rendered(r)
    assert len(rows) < len(r.slots) // 8
    # every device appears in exactly one row's range: expand the ranges back
    seen: list[int] = []
    for row in rows:
        for part in row.split("│")[1].strip().split(", "):
            lo, _, hi = part.partition("-")
            a = int(lo.removeprefix("d"))
            b = int(hi.removeprefix("d")) if hi else a
            seen.extend(range(a, b + 1))
    assert sorted(seen) == sorted(d.id for i in _ran(r) for d in r.slot_devices[i])
    # a merged row's slots print the same figures: the first stage's compute row holds its 64 GPUs
    assert any("0-63 A100" in row and "(" not in row.split("│")[2] for row in rows)
