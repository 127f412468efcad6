"""Module assembly: the flat program as one function, or as a chain of layer functions.

A graph exported from PyTorch carries each node's module scope — the ``pkg.torch.onnx.name_scopes``
metadata of ``torch.onnx.export(..., dynamo=True)`` (``['', 'model', 'model.h.0', ...]``) or, from
the TorchScript exporter, node names like ``/transformer/h.0/attn/MatMul``. When some module path
``P.N`` repeats with several indices N (GPT-2's ``transformer.h.0``, ``transformer.h.1``), the
nodes are grouped: the ones before the first block (``@pre``: embeddings), one group per block
index, the ones after the last (``@post``: final norm, head). A node without a scope joins the
group of its first input's producer. Ops whose inputs are all constants (``Constant`` and what
is computed from constants only) belong to no group: each group that uses them gets its own copy.

The grouping is kept only if it is a chain — the model contract's shape
(``distir.frontends.zoo.model``): each group takes the previous group's one result (the first
group the first graph input) plus weights and other graph inputs, and the last group returns
the graph's one output. A value a group needs from an earlier one that is known at import time
(sizes taken with ``Shape``, a causal mask computed from them — a dynamic-shape export) is
recomputed in the group from such values, down to ``Constant``s of the small ones read from
tensors (``Shape`` of a graph input): such layers are specialized to the imported sizes. Blocks that
compute the same thing (compared by dataflow, not op order) are one function called once per
block (``@block``), their weights passed as arguments. Otherwise (no scopes, no repeated blocks, a
value skipping a group, several outputs) the program is a single function, and ``Layering.note``
says why.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from distir.frontends.onnx_import.values import Program
from distir.ir.builder import FunctionBuilder
from distir.ir.function import Function, Module
from distir.ir.ops import Op
from distir.ir.values import Value

ENTRY = "forward"
PORTABLE_LIMIT = 1 << 12  # elements of a known value a layer may take as a Constant
_BLOCK = re.compile(r"^(.*)\.(\d+)$")


@dataclass(frozen=True, slots=True)
class Layering:
    """The assembled module, the layer functions called in order (empty: a single function),
    the weights more than one layer uses, and why there are no layers when there are none."""

    module: Module
    layers: tuple[str, ...]
    shared: tuple[str, ...]
    note: str


def scopes_of(node: Any) -> tuple[str, ...]:
    """A node's module paths, outermost first (metadata, else a ``/a/b.0/...`` node name)."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                paths = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return ()
            return tuple(str(s) for s in paths[:-1] if s)  # the last one is the node itself
    if node.name.startswith("/"):
        parts = [x for x in node.name.split("/")[1:-1] if x]
        return tuple(".".join(parts[: i + 1]) for i in range(len(parts)))
    return ()


def single(program: Program, outputs: Sequence[Value]) -> Function:
    return Function(ENTRY, tuple(v for v, _ in program.params), tuple(program.ops), tuple(outputs))


def assemble(program: Program, outputs: Sequence[Value], scopes: Sequence[tuple[str, ...]]) -> Layering:
    whole = Module((single(program, outputs),))
    prefix = _block_prefix(scopes)
    if prefix is None:
        return Layering(whole, (), (), "no repeated module blocks in the node scopes")
    if len(outputs) != 1:
        return Layering(whole, (), (), f"the graph has {len(outputs)} outputs; layers need one")
    groups = _group_ops(program, scopes, prefix)
    try:
        module, layers, shared = _chain(program, outputs[0], groups)
    except _NotAChain as e:
        return Layering(whole, (), (), str(e))
    return Layering(module, layers, shared, "")


class _NotAChain(Exception):
    pass


def _block_prefix(scopes: Sequence[tuple[str, ...]]) -> str | None:
    """The module path whose numbered children repeat most (at least twice)."""
    seen: dict[str, set[int]] = {}
    for paths in scopes:
        for s in paths:
            m = _BLOCK.match(s)
            if m:
                seen.setdefault(m.group(1), set()).add(int(m.group(2)))
    best = max(seen.items(), key=lambda kv: (len(kv[1]), -len(kv[0])), default=None)
    return best[0] if best is not None and len(best[1]) >= 2 else None


PRE, POST = -1, 1 << 30


def _node_groups(scopes: Sequence[tuple[str, ...]], prefix: str) -> list[int | None]:
    """Per node: its block index, PRE / POST for scoped nodes outside the blocks, None unscoped."""
    block: list[int | None] = []
    for paths in scopes:
        idx = None
        for s in paths:
            m = _BLOCK.match(s)
            if m and m.group(1) == prefix:
                idx = int(m.group(2))
        block.append(idx)
    placed = [k for k, b in enumerate(block) if b is not None]
    first, last = (placed[0], placed[-1]) if placed else (0, -1)
    out: list[int | None] = []
    for k, (b, paths) in enumerate(zip(block, scopes, strict=True)):
        if b is not None:
            out.append(b)
        elif paths and k < first:
            out.append(PRE)
        elif paths and k > last:
            out.append(POST)
        else:
            out.append(None)
    return out


def _group_ops(program: Program, scopes: Sequence[tuple[str, ...]], prefix: str) -> list[int | None]:
    """Per op: its group, or None for a constant-only op (copied into each group using it)."""
    by_node = _node_groups(scopes, prefix)
    producer: dict[Value, int] = {}
    groups: list[int | None] = []
    params = {v for v, _ in program.params}
    for i, op in enumerate(program.ops):
        froms = [producer[v] for v in op.inputs if v in producer]
        floating = all(v not in params and v in producer and groups[producer[v]] is None for v in op.inputs)
        k = program.origin[i]
        if floating:
            g = None
        elif k >= 0 and by_node[k] is not None:
            g = by_node[k]
        else:
            fixed = [groups[j] for j in froms if groups[j] is not None]
            g = fixed[0] if fixed else PRE
        groups.append(g)
        for v in op.outputs:
            producer[v] = i
    return groups


def _chain(
    program: Program, output: Value, groups: list[int | None]
) -> tuple[Module, tuple[str, ...], tuple[str, ...]]:
    order = sorted({g for g in groups if g is not None})
    params = [v for v, _ in program.params]
    first_input = params[0] if params and program.params[0][1].value is None else None
    if first_input is None:
        raise _NotAChain("the graph has no input to start the chain of layers")
    where: dict[Value, int] = {}  # value -> the group making it (None groups are constants)
    floating: dict[Value, Op] = {}
    for op, g in zip(program.ops, groups, strict=True):
        for v in op.outputs:
            if g is None:
                floating[v] = op
            else:
                where[v] = g
    producer = {v: op for op in program.ops for v in op.outputs}
    free = _input_free(program)
    members: dict[int, list[Op]] = {g: [] for g in order}
    for op, g in zip(program.ops, groups, strict=True):
        if g is not None:
            members[g].append(op)
    acts: list[Value] = [first_input]
    fb = FunctionBuilder(ENTRY)
    entry_params = {p: fb.param(p.name, p.type) for p in params}
    fns: dict[tuple[Any, ...], Function] = {}
    ids: dict[tuple[Any, ...], int] = {}
    layers: list[str] = []
    users: Counter[Value] = Counter()
    prev = entry_params[first_input]
    for n, g in enumerate(order):
        out = (
            output
            if n == len(order) - 1
            else _exported(members[g], where, g, order[n + 1 :], program, output, free)
        )
        fn_args, fn = _layer(
            members[g], acts[-1], out, where, floating, g, program, producer, _name(g, order), free
        )
        key = _structure(fn, ids)
        got = fns.get(key)
        if got is None:
            got = fns[key] = Function(
                _unique(_name(g, order), {f.name for f in fns.values()}), fn.params, fn.body, fn.outputs
            )
        layers.append(got.name)
        for v in fn_args:
            if v in entry_params and v is not first_input:
                users[v] += 1
        (prev,) = fb.call(got, prev, *(entry_params[v] for v in fn_args), names=[f"{got.name}_{n}"])
        acts.append(out)
    shared = tuple(v.name for v, c in users.items() if c > 1)
    entry = fb.ret(prev)
    return Module((*fns.values(), entry)), tuple(layers), shared


def _name(g: int, order: Sequence[int]) -> str:
    return "pre" if g == PRE else "post" if g == POST else "block"


def _unique(name: str, taken: set[str]) -> str:
    k, got = 1, name
    while got in taken:
        got, k = f"{name}_{k}", k + 1
    return got


def _exported(
    ops: list[Op],
    where: dict[Value, int],
    g: int,
    later: Sequence[int],
    program: Program,
    output: Value,
    free: frozenset[Value],
) -> Value:
    """The one value of group ``g`` that later groups use: the next group's activation (a value
    each layer can compute for itself, ``_portable`` with ``free`` the input-free values, is
    not passed)."""
    made = {v for op in ops for v in op.outputs}
    used_by: dict[Value, set[int]] = {}
    for op, h in zip(program.ops, _groups_of(program, where), strict=True):
        if h is None or h == g:
            continue
        for v in op.inputs:
            if v in made and not _portable(program, v, free):
                used_by.setdefault(v, set()).add(h)
    if output in made:
        raise _NotAChain(f"the graph output %{output.name} is made before the last layer")
    if len(used_by) != 1:
        names = ", ".join("%" + v.name for v in used_by) or "none"
        raise _NotAChain(
            f"layer group {_label(g)} passes {len(used_by)} values to later layers ({names}), not one"
        )
    ((v, hs),) = used_by.items()
    if hs != {later[0]}:
        raise _NotAChain(f"%{v.name} of layer group {_label(g)} is used beyond the next layer")
    return v


def _groups_of(program: Program, where: dict[Value, int]) -> list[int | None]:
    return [where.get(op.outputs[0]) if op.outputs else None for op in program.ops]


def _label(g: int) -> str:
    return "pre" if g == PRE else "post" if g == POST else str(g)


def _layer(
    ops: list[Op],
    act: Value,
    out: Value,
    where: dict[Value, int],
    floating: dict[Value, Op],
    g: int,
    program: Program,
    producer: dict[Value, Op],
    name: str,
    free: frozenset[Value],
) -> tuple[list[Value], Function]:
    """Group ``g``'s function: (activation, outside values it uses...) -> out; the outside
    values (entry parameters) are returned in parameter order. Constant-only ops are copied in;
    a small value of another group known at import time is recomputed the same way when its
    inputs are such values too, else it becomes a ``Constant``."""
    fb = FunctionBuilder(name)
    vmap: dict[Value, Value] = {act: fb.param(act.name)}
    args: list[Value] = []
    weights = {v for v, p in program.params if p.value is not None}

    def get(v: Value) -> Value:
        got = vmap.get(v)
        if got is not None:
            return got
        if v in floating:
            _copy(floating[v], get, fb, vmap)
            return vmap[v]
        if v in where and _portable(program, v, free):
            made = producer[v]
            if all(u in floating or u in weights or (u in where and u in free) for u in made.inputs):
                _copy(made, get, fb, vmap)  # recomputed from constants and weights: in each layer
                return vmap[v]
            arr = program.known(v)
            if arr is None:
                raise _NotAChain(
                    f"layer group {_label(g)} uses %{v.name} of layer group {_label(where[v])}, "
                    "computed from the weights by ops it cannot recompute"
                )
            if arr.size > PORTABLE_LIMIT:
                raise _NotAChain(
                    f"layer group {_label(g)} uses %{v.name} of layer group {_label(where[v])}, known at "
                    f"import but of {arr.size} elements (copied as a constant only up to {PORTABLE_LIMIT})"
                )
            t = program.type(v)
            attrs = {"value": arr.tolist(), "dtype": t.dtype, "device": t.device}
            (vmap[v],) = fb.op("Constant", names=[v.name], **attrs)
            return vmap[v]
        if v in where:
            raise _NotAChain(
                f"layer group {_label(g)} uses %{v.name} of layer group {_label(where[v])}, "
                "not the previous layer's result"
            )
        vmap[v] = p = fb.param(v.name)
        args.append(v)
        return p

    live = {out}
    needed: list[Op] = []  # what ``out`` needs (a rotary table the later layers make for themselves: not)
    for op in reversed(ops):
        if any(v in live for v in op.outputs):
            needed.append(op)
            live.update(op.inputs)
    for op in reversed(needed):
        _copy(op, get, fb, vmap)
    return args, fb.ret(get(out))


def _portable(program: Program, v: Value, free: frozenset[Value]) -> bool:
    """Whether a layer may compute ``v`` for itself rather than take it from an earlier layer
    (``_input_free``)."""
    return v in free


def _input_free(program: Program) -> frozenset[Value]:
    """The values that do not depend on the graph inputs' values: known at import time (computed
    from sizes and constants) or computed from such values and weights alone (a rotary
    embedding's cos and sin of its frequencies)."""
    free = {v for v, p in program.params if p.value is not None}
    for op in program.ops:
        if all(v in free for v in op.inputs) or all(program.known(v) is not None for v in op.outputs):
            free.update(op.outputs)
    return frozenset(free)


def _copy(op: Op, get: Any, fb: FunctionBuilder, vmap: dict[Value, Value]) -> None:
    ins = tuple(get(v) for v in op.inputs)
    outs = tuple(Value(v.name) for v in op.outputs)
    fb.append(Op(op.name, ins, outs, op.attrs))
    for a, b in zip(op.outputs, outs, strict=True):
        vmap[a] = b


def _structure(fn: Function, ids: dict[tuple[Any, ...], int]) -> tuple[Any, ...]:
    """What the function computes, up to value names and op order: each value is numbered by
    (op, attributes, the numbers of its inputs, result index) — hash-consed in ``ids``, shared
    by the functions compared — so two blocks with the same dataflow get the same key even when
    their ops are listed in different orders (constants recomputed at first use)."""
    ref: dict[Value, int] = {}
    for i, p in enumerate(fn.params):
        ref[p] = ids.setdefault(("p", i), len(ids))
    for instr in fn.body:
        assert isinstance(instr, Op)
        ins = tuple(ref[v] for v in instr.inputs)
        for j, v in enumerate(instr.outputs):
            ref[v] = ids.setdefault((instr.name, instr.attrs, ins, j), len(ids))
    return (len(fn.params), tuple(ref[v] for v in fn.outputs))


__all__ = ["ENTRY", "Layering", "assemble", "scopes_of", "single"]
