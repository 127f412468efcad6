"""Rotary position embedding written out in an ONNX graph, as the fused ``Rope``.

An exporter writes Hugging Face's ``apply_rotary_pos_emb`` (Llama, Mistral, Qwen2) as its
formula on the (B, h, S, d) queries and keys: ``x · cos + rotate_half(x) · sin``, where
``rotate_half`` is ``Concat(−x[…, d/2:], x[…, :d/2])`` and the tables are ``cos`` and ``sin`` of
``Concat(f, f)``, ``f`` the positions times the model's frequencies (``rotary_emb.inv_freq``,
a weight of the file). When the positions are 0 … S − 1 and the frequencies are known, the
chain becomes one ``Rope(x, halves=true, freqs=…)`` in the BSHD layout (transposed around it;
the attention fusion cancels the transposes), as the trainers' fused rotary kernels run it; the
tables and the frequencies, then unused, are dropped. Anything else stays as written.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from distir.frontends.onnx_import.chains import replace_matches
from distir.frontends.onnx_import.values import Program
from distir.ir.ops import Op
from distir.ir.values import Value

_BHSD = (0, 2, 1, 3)


class _Rotary(NamedTuple):
    x: Value  # (B, h, S, d)
    freqs: tuple[float, ...]


def fuse_rope(program: Program, outputs: tuple[Value, ...]) -> None:
    """Rewrite every matched chain of ``program`` in place (module docstring)."""
    made, uses = program.dataflow(outputs)
    weights = {v: p.value for v, p in program.params if p.value is not None}
    found = {id(op): r for op in program.ops if (r := _rotary(program, op, made, uses, weights)) is not None}

    def emit(op: Op, k: int, r: _Rotary) -> None:
        where = f"node #{k} (rotary embedding)"
        src = made.get(r.x)
        if src is not None and src.name == "Transpose" and tuple(_ints(src.attrs.get("perm"))) == _BHSD:
            xs = src.inputs[0]  # the head transpose's input: already BSHD
        else:
            (xs,) = program.emit("Transpose", (r.x,), {"perm": _BHSD}, [f"{r.x.name}_bshd"], k, where)
        attrs = {"halves": True, "freqs": r.freqs}
        (y,) = program.emit("Rope", (xs,), attrs, [f"{op.outputs[0].name}_rope"], k, where)
        program.emit("Transpose", (y,), {"perm": _BHSD}, [op.outputs[0].name], k, where, op.outputs)

    replace_matches(program, outputs, found, emit)


def _rotary(
    program: Program, add: Op, made: dict[Value, Op], uses: dict[Value, int], weights: dict[Value, np.ndarray]
) -> _Rotary | None:
    """(x, frequencies) when ``add`` is ``x · cos + rotate_half(x) · sin``, else None."""
    if add.name != "Add" or len(add.inputs) != 2:
        return None
    for a, b in (add.inputs, add.inputs[::-1]):
        direct, rotated = made.get(a), made.get(b)
        if direct is None or rotated is None or direct.name != "Mul" or rotated.name != "Mul":
            continue
        if uses.get(a) != 1 or uses.get(b) != 1:
            continue
        for x, cos_u in (direct.inputs, direct.inputs[::-1]):
            for rot, sin_u in (rotated.inputs, rotated.inputs[::-1]):
                if program.type(x).rank != 4 or not _rotates_half(program, rot, x, made, uses):
                    continue
                freqs = _tables(program, cos_u, sin_u, program.type(x).shape[2], made, weights)
                if freqs is not None:
                    return _Rotary(x, freqs)
    return None


def _rotates_half(
    program: Program, rot: Value, x: Value, made: dict[Value, Op], uses: dict[Value, int]
) -> bool:
    """Whether ``rot`` is ``Concat(−x[…, d/2:], x[…, :d/2])`` on the last dim, read once."""
    cat = made.get(rot)
    d = program.type(x).shape[-1]
    if cat is None or cat.name != "Concat" or len(cat.inputs) != 2 or uses.get(rot) != 1:
        return False
    if cat.attrs.get("axis") not in (-1, 3) or d % 2:
        return False
    neg, first = made.get(cat.inputs[0]), made.get(cat.inputs[1])
    second = made.get(neg.inputs[0]) if neg is not None and neg.name == "Neg" else None
    return (
        second is not None
        and first is not None
        and _half(program, first, x, 0, d // 2)
        and _half(program, second, x, d // 2, d)
        and uses.get(cat.inputs[0]) == 1
        and uses.get(neg.inputs[0]) == 1  # type: ignore[union-attr]
    )


def _half(program: Program, op: Op, x: Value, lo: int, hi: int) -> bool:
    """Whether ``op`` is ``x[…, lo:hi]`` (a Slice of the last dim; its end may pass the dim)."""
    if op.name != "Slice" or not op.inputs or op.inputs[0] is not x:
        return False
    d = program.type(x).shape[-1]
    axes, starts, ends = (_ints(op.attrs.get(k)) for k in ("axes", "starts", "ends"))
    steps = _ints(op.attrs.get("steps")) or [1]
    end_ok = len(ends) == 1 and (ends[0] == hi or (hi == d and ends[0] >= d))
    return axes in ([3], [-1]) and starts == [lo] and end_ok and steps == [1]


def _ints(v: object) -> list[int]:
    return [] if v is None else [int(i) for i in np.asarray(v).reshape(-1)]


def _tables(
    program: Program,
    cos_u: Value,
    sin_u: Value,
    s: int,
    made: dict[Value, Op],
    weights: dict[Value, np.ndarray],
) -> tuple[float, ...] | None:
    """The frequencies when ``cos_u`` and ``sin_u`` are ``cos``/``sin`` of ``Concat(f, f)`` on the
    last dim, unsqueezed at the heads — (…, 1, S, d), lined up with x's positions and features —
    with ``f`` (…, S, d/2) the outer product of the positions 0 … ``s`` − 1, (…, S, 1), and a
    weight's known values, (d/2,)."""
    d = program.type(cos_u).shape[-1]
    for u in (cos_u, sin_u):
        t = program.type(u)
        if t.rank != 4 or t.shape[1] != 1 or t.shape[-2:] != (s, d) or d % 2:
            return None
    embs = []
    for u, fn in ((cos_u, "Cos"), (sin_u, "Sin")):
        unsq = made.get(u)
        trig = made.get(unsq.inputs[0]) if unsq is not None and unsq.name == "Unsqueeze" else None
        if trig is None or trig.name != fn or _ints(unsq.attrs.get("axes")) != [1]:  # type: ignore[union-attr]
            return None
        embs.append(trig.inputs[0])
    if embs[0] is not embs[1]:
        return None
    cat = made.get(embs[0])
    if cat is None or cat.name != "Concat" or len(cat.inputs) != 2 or cat.inputs[0] is not cat.inputs[1]:
        return None
    if _ints(cat.attrs.get("axis")) not in ([-1], [program.type(embs[0]).rank - 1]):
        return None
    mul = made.get(cat.inputs[0])
    if mul is None or mul.name != "Mul" or len(mul.inputs) != 2:
        return None
    if program.type(mul.outputs[0]).shape[-2:] != (s, d // 2):
        return None
    for pos, w in (mul.inputs, mul.inputs[::-1]):
        known, freqs = program.known(pos), weights.get(w)
        if (
            known is None
            or freqs is None
            or freqs.shape != (d // 2,)
            or program.type(pos).shape[-2:] != (s, 1)
        ):
            continue
        # the positions as the model's dtype holds them (f16 rounds those past 2,048)
        if np.array_equal(np.asarray(known).reshape(-1), np.arange(s).astype(np.asarray(known).dtype)):
            return tuple(float(f) for f in freqs)
    return None
