"""Lock-step execution of per-rank programs, and the deadlock check built on it.

Each rank runs its (call-inlined) program in order. Local ops proceed on their own; a rank op
(``rank.Send``, ``rank.Recv``, ``rank.AllReduce``, ...) blocks until every participant named by
its ``Rendezvous`` has reached a matching op (same key: peers, group, shapes, attributes); then
they all complete together — the blocking semantics of DistIR's Send and collectives. If no
rank can move and some have not finished, the programs deadlock (or mismatch), and
``DeadlockError`` names every blocked rank, the op it is stuck at, and whom it waits for.

``check_deadlock_free`` runs the schedule without data; ``run_ranks`` also computes values with
the reference implementations, so per-rank programs can be checked against the global program.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distir.interp.reference import ReferenceDomain
from distir.ir.function import Module
from distir.ir.ops import Op
from distir.ir.printer import print_op
from distir.ir.rewrite import inline_calls
from distir.ir.types import Device, ScalarType, TensorType
from distir.ir.values import Value
from distir.ops.rank_comm import RANK_RECV, RANK_SEND, Rendezvous
from distir.ops.registry import REGISTRY, OpKind


class DeadlockError(ValueError):
    """Per-rank programs cannot all finish. ``blocked`` maps each stuck rank to its op text."""

    def __init__(self, message: str, blocked: Mapping[Device, str]) -> None:
        super().__init__(message)
        self.blocked = dict(blocked)


@dataclass(slots=True)
class _Rank:
    device: Device
    ops: list[Op]
    pc: int
    env: dict[Value, Any]
    outputs: tuple[Value, ...]


def _waiting(r: _Rank) -> tuple[Rendezvous, tuple[Device, ...], tuple[Any, ...]] | None:
    if r.pc >= len(r.ops):
        return None
    op = r.ops[r.pc]
    rv = REGISTRY[op.name].rendezvous
    assert rv is not None
    return rv, rv.participants(op.attrs, r.device), rv.key(op.name, op.attrs, r.device)


def _schedule(
    programs: Mapping[Device, Module], inputs: Mapping[Device, Sequence[Any]] | None
) -> dict[Device, tuple[Any, ...]]:
    execute = inputs is not None
    ranks: dict[Device, _Rank] = {}
    for dev, m in programs.items():
        flat = inline_calls(m)
        env: dict[Value, Any] = {}
        if inputs is not None:
            args = list(inputs.get(dev, ()))
            if len(args) != len(flat.params):
                raise ValueError(f"rank {dev} takes {len(flat.params)} inputs, got {len(args)}")
            env = dict(zip(flat.params, args, strict=True))
        ops = [i for i in flat.body if isinstance(i, Op)]
        ranks[dev] = _Rank(dev, ops, 0, env, flat.outputs)
    ref = ReferenceDomain()

    def advance_local(r: _Rank) -> None:
        while r.pc < len(r.ops):
            op = r.ops[r.pc]
            if REGISTRY[op.name].kind is OpKind.RANK_COMM:
                return
            if REGISTRY[op.name].kind is OpKind.COMM:
                raise DeadlockError(
                    f"rank {r.device} holds the global op `{print_op(op)}`; "
                    "per-rank programs must use rank.* ops",
                    {r.device: print_op(op)},
                )
            if execute:
                outs = ref.op(op, [r.env[v] for v in op.inputs])
                r.env.update(zip(op.outputs, outs, strict=True))
            r.pc += 1

    while True:
        for r in ranks.values():
            advance_local(r)
        if all(r.pc >= len(r.ops) for r in ranks.values()):
            break
        fired = False
        for r in ranks.values():
            w = _waiting(r)
            if w is None:
                continue
            rv, parts, key = w
            peers = [ranks.get(p) for p in parts]
            if any(p is None for p in peers):
                missing = [str(d) for d, p in zip(parts, peers, strict=True) if p is None]
                raise DeadlockError(
                    f"rank {r.device} at `{print_op(r.ops[r.pc])}` waits for "
                    f"{', '.join(missing)}, which has no program",
                    {r.device: print_op(r.ops[r.pc])},
                )
            ready = True
            for p in peers:
                assert p is not None
                wp = _waiting(p)
                if wp is None or wp[1] != parts or wp[2] != key:
                    ready = False
                    break
            if not ready:
                continue
            meeting = {p.device: p.ops[p.pc] for p in peers if p is not None}
            _check_transfer(meeting)
            if execute:
                ins = {d: [ranks[d].env[v] for v in op.inputs] for d, op in meeting.items()}
                outs = rv.run(ins, {d: op.attrs for d, op in meeting.items()})
                for d, op in meeting.items():
                    ranks[d].env.update(zip(op.outputs, outs[d], strict=True))
            for p in peers:
                assert p is not None
                p.pc += 1
            fired = True
            break
        if not fired:
            blocked = {r.device: print_op(r.ops[r.pc]) for r in ranks.values() if r.pc < len(r.ops)}
            lines = []
            for r in ranks.values():
                w = _waiting(r)
                if w is None:
                    continue
                others = ", ".join(str(d) for d in w[1] if d != r.device)
                lines.append(f"  {r.device} (op {r.pc + 1}) `{blocked[r.device]}` waits for {others}")
            raise DeadlockError("per-rank programs deadlock or mismatch:\n" + "\n".join(lines), blocked)
    results: dict[Device, tuple[Any, ...]] = {}
    if execute:
        for d, r in ranks.items():
            results[d] = tuple(r.env[v] for v in r.outputs)
    return results


def _strip_device(t: object) -> object:
    if isinstance(t, TensorType):
        return ("tensor", t.dtype, t.shape)
    if isinstance(t, ScalarType):
        return ("scalar", t.dtype)
    return t


def _check_transfer(meeting: Mapping[Device, Op]) -> None:
    """A Send must deliver what its Recv declares (dtype, shape, tensor or scalar)."""
    sends = [op for op in meeting.values() if op.name == RANK_SEND.name]
    recvs = [op for op in meeting.values() if op.name == RANK_RECV.name]
    if sends and recvs:
        sent = sends[0].inputs[0].type
        attrs = recvs[0].attrs
        shape = attrs.get("shape")
        got: object = (
            ("scalar", attrs.get("dtype")) if shape is None else ("tensor", attrs.get("dtype"), shape)
        )
        if sent is not None and _strip_device(sent) != got:
            blocked = {d: print_op(op) for d, op in meeting.items()}
            raise DeadlockError(
                f"`{print_op(sends[0])}` sends {sent} but `{print_op(recvs[0])}` receives {got}", blocked
            )


def check_deadlock_free(programs: Mapping[Device, Module]) -> None:
    """Raise ``DeadlockError`` unless every rank's communication matches up in order."""
    _schedule(programs, None)


def run_ranks(
    programs: Mapping[Device, Module], inputs: Mapping[Device, Sequence[Any]]
) -> dict[Device, tuple[Any, ...]]:
    """Execute per-rank programs together on the reference executor; outputs per rank."""
    return _schedule(programs, inputs)
