"""``simulate --model ... --device-map``: a map that leaves out some of the program's devices
(the communication streams' devices a strategy adds, which the user does not see) is refused
with the strategy's own map, every device placed, to edit."""

from __future__ import annotations

from typer.testing import CliRunner

from distir.cli import app


def test_a_partial_map_over_a_strategy_shows_the_strategys_map() -> None:
    args = ["simulate", "--model", "gpt2-117m:layers=2", "--cluster", "dgx-a100", "--strategy", "d2.t1.p1.k1"]
    r = CliRunner().invoke(app, [*args, "--device-map", "d0=1,d1=0"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert (
        "device map does not place d10, d11 (the strategy's map, every device of the program: d0=0,d1=1,"
        in r.stderr
    )
    full = r.stderr.split("every device of the program: ")[1].rstrip().rstrip(")")
    swapped = full.replace("d0=0,d1=1,", "d0=1,d1=0,", 1)
    r = CliRunner().invoke(app, [*args, "--device-map", swapped, "--json"])
    assert r.exit_code == 0, r.stderr
