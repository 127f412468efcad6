"""The interpreter's error (``distir.interp.loop.InterpretError``): its full text names every
call site; ``brief`` is the one line the CLI prints for a model's program."""

from __future__ import annotations

from distir.interp.loop import InterpretError


def test_brief_is_one_line_naming_the_callers() -> None:
    e = InterpretError(
        "Redistribute needs a distributed tensor",
        [
            ("block_fwd", "%y = Redistribute(%x)"),
            ("c0_fwd", "%a, %b = @block_fwd(%x, %w)"),
            ("step", "%c = @c0_fwd(%i)"),
        ],
        expected="DTensor[...]",
        actual="Tensor[f32, (8, 4), d0]",
    )
    assert str(e).count("\n") == 2  # the full text: every call site's op
    assert e.brief() == (
        "while interpreting `%y = Redistribute(%x)` in @block_fwd: Redistribute needs a distributed "
        "tensor (expected DTensor[...], got Tensor[f32, (8, 4), d0]) (called from @c0_fwd ← @step)"
    )
    alone = InterpretError("bad", [("f", "%y = Relu(%x)")])
    assert alone.brief() == "while interpreting `%y = Relu(%x)` in @f: bad"
