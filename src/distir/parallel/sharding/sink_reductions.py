"""Optimizations of legalized DTensor programs.

``sink_reductions`` moves an op across a pending reduction when that is valid — the RFC's
multiply/redistribute swap: ``%z_r = Redistribute(%z: P(sum), to="R"); %o = Mul(%z_r, %c)``
becomes ``%o_p = Mul(%z, %c); %o = Redistribute(%o_p, to="R")`` when the op's sharding rule
takes the pending sum as it is (Mul by a replicated tensor distributes over the sum; Gelu does
not). The local op can then be fused with the one producing ``%z``, and the reduction moves a
value that may be smaller. Validity is decided by the op's own rule (type inference on the new
placements), never by op names. A pure pass ``Module -> Module``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from distir.ir.builder import FunctionBuilder
from distir.ir.dtensor import DTensorType, Partial, Replicate, format_placements
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ir.rewrite import ValueMap, copy_instr
from distir.ir.values import Attrs, Value
from distir.ops.registry import REGISTRY, OpKind, OpTypeError


def sink_reductions(module: Module) -> Module:
    fn = module.entry
    uses: dict[Value, int] = {}
    for instr in fn.body:
        for v in instr.inputs:
            uses[v] = uses.get(v, 0) + 1
    for v in fn.outputs:
        uses[v] = uses.get(v, 0) + 1
    pending: dict[Value, Op] = {}  # result of a movable Redistribute -> that op
    for instr in fn.body:
        if (
            isinstance(instr, Op)
            and instr.name == "Redistribute"
            and uses.get(instr.outputs[0]) == 1
            and _only_reduces(instr)
        ):
            pending[instr.outputs[0]] = instr
    fb = FunctionBuilder(fn.name)
    vmap = ValueMap()
    for p in fn.params:
        vmap.bind(p, fb.param(p.name, p.type))
    deferred: dict[Op, None] = {}

    def flush(v: Value) -> None:
        """Emit the deferred Redistribute producing ``v``, if any (its user comes next)."""
        r = pending.get(v)
        if r is not None and r in deferred:
            fb.append(copy_instr(r, vmap))
            del deferred[r]

    for instr in fn.body:
        if isinstance(instr, Op) and instr in pending.values():
            deferred[instr] = None  # emitted later, where its only user is
            continue
        moved = _try_sink(fb, vmap, instr, pending, flush) if isinstance(instr, Op) else None
        if moved is not None:
            deferred.pop(moved, None)  # replaced by the reduction after the op
        else:
            for v in instr.inputs:
                flush(v)
            fb.append(copy_instr(instr, vmap))
    for r in deferred:
        fb.append(copy_instr(r, vmap))
    return module.replace(replace(fb.ret(*(vmap(v) for v in fn.outputs)), donated=fn.donated))


def _only_reduces(op: Op) -> bool:
    """A Redistribute that only resolves pending reductions (Partial -> Replicate on some axes,
    every other axis unchanged): moving an op across it never makes communication bigger, while
    moving one across a gather or an all-to-all could."""
    src, dst = op.inputs[0].type, op.outputs[0].type
    if not isinstance(src, DTensorType) or not isinstance(dst, DTensorType):
        return False
    changed = [(a, b) for a, b in zip(src.placements, dst.placements, strict=True) if a != b]
    return bool(changed) and all(isinstance(a, Partial) and isinstance(b, Replicate) for a, b in changed)


def _try_sink(
    fb: FunctionBuilder, vmap: ValueMap, op: Op, pending: dict[Value, Op], flush: Callable[[Value], None]
) -> Op | None:
    """Emit ``op`` on the unreduced input and the reduction after it; the Redistribute moved.
    The op's other inputs may come from deferred Redistributes too: ``flush`` emits those first."""
    d = REGISTRY[op.name]
    if d.kind is not OpKind.LOCAL or len(op.outputs) != 1:
        return None
    for j, v in enumerate(op.inputs):
        r = pending.get(v)
        if r is None:
            continue
        src = r.inputs[0]
        ins = [t for t in (x.type for x in op.inputs) if t is not None]
        if len(ins) != len(op.inputs) or not isinstance(src.type, DTensorType):
            return None
        ins[j] = src.type
        try:
            (out,) = d.infer_types(ins, op.attrs, [None] * len(ins))
        except (OpTypeError, ValueError):
            continue
        want = op.outputs[0].type
        if not isinstance(out, DTensorType) or not isinstance(want, DTensorType):
            continue
        for k, x in enumerate(op.inputs):
            if k != j:
                flush(x)
        new_ins = tuple(vmap(src) if k == j else vmap(x) for k, x in enumerate(op.inputs))
        (partial,) = fb.emit(op.name, new_ins, op.attrs, [f"{op.outputs[0].name}_p"], [out])
        (res,) = fb.emit(
            "Redistribute",
            (partial,),
            Attrs({"to": format_placements(want.placements)}),
            [op.outputs[0].name],
            [want],
        )
        vmap.bind(op.outputs[0], res)
        return r
    return None
