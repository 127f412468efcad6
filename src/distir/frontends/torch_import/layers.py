"""Layer functions by module path: which ops of a traced program form which layer.

The repeated blocks are the numbered children of the module container whose numbered children
hold the most ops among the module paths the ops were traced in (``transformer.h`` for GPT-2's
``transformer.h.N``, ``model.layers`` for Llama's ``model.layers.N``; ``block_container``): an
op whose module stack passes through ``<container>.N`` belongs to block N. Ops before the first
block are the ``pre`` layer (the embedding), ops after the last the ``post`` layer (final norm,
head); an op of no block between two blocks is an error (``StructureError``). A model without
numbered children is one layer.

Every op keeps the module path it came from (``LayerOf.path``), so split points by module name
(PiPPy's ``--split model.layers.12``) can be placed on these boundaries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from distir.frontends.torch_import.errors import StructureError
from distir.limits import is_digits

PRE, POST = "pre", "post"
_NUMBERED = re.compile(r"^(?P<prefix>.*)\.(?P<index>[0-9]+)$|^(?P<top>[0-9]+)$")


@dataclass(frozen=True, slots=True)
class LayerOf:
    """Where an op goes: ``key`` (``pre``, ``post``, or the block's module path) and the
    innermost module path it was traced in."""

    key: str
    path: str


def module_paths(stack: object) -> list[str]:
    """The module paths of an FX node's ``nn_module_stack`` metadata, outermost first."""
    if not isinstance(stack, dict):
        return []
    return [str(v[0]) for v in stack.values() if isinstance(v, tuple) and v]


def block_container(paths: Iterable[str]) -> str | None:
    """The container whose numbered children are the blocks (module docstring), or None.
    ``paths`` are the ops' module paths (each op's stack once): among the containers with two
    or more numbered children, the one whose children hold the most ops — the blocks, not an
    ``nn.Sequential`` inside each (``mlp.0``, ``mlp.1``, ``mlp.2``), which may have more
    children than the model has blocks — then the most children, then the shortest path."""
    children: dict[str, set[int]] = {}
    ops: dict[str, int] = {}
    for p in paths:
        m = _NUMBERED.match(p)
        if m:
            prefix = m.group("prefix") if m.group("prefix") is not None else ""
            children.setdefault(prefix, set()).add(int(m.group("index") or m.group("top")))
            ops[prefix] = ops.get(prefix, 0) + 1
    if not children:
        return None
    return max(children, key=lambda c: (len(children[c]) >= 2, ops[c], len(children[c]), -len(c)))


def block_of(paths: Sequence[str], container: str | None) -> str | None:
    if container is None:
        return None
    head = f"{container}." if container else ""
    for p in paths:
        rest = p[len(head) :] if p.startswith(head) else None
        if rest is not None and is_digits(rest):
            return p
    return None


def assign(stacks: Sequence[Sequence[str]], names: Sequence[str]) -> list[LayerOf]:
    """The layer of each op (in program order), from its module paths; ``names`` name the ops
    for errors."""
    container = block_container(p for s in stacks for p in s)
    blocks = [block_of(s, container) for s in stacks]
    seen = [i for i, b in enumerate(blocks) if b is not None]
    out: list[LayerOf] = []
    if not seen:
        return [LayerOf("body", s[-1] if s else "") for s in stacks]
    first, last = seen[0], seen[-1]
    done: set[str] = set()
    current: str | None = None
    for i, (s, b) in enumerate(zip(stacks, blocks, strict=True)):
        path = s[-1] if s else ""
        if b is not None:
            if b != current:
                if b in done:
                    raise StructureError(f"block {b} runs again after another block (op {names[i]})")
                if current is not None:
                    done.add(current)
                current = b
            out.append(LayerOf(b, path))
        elif i < first:
            out.append(LayerOf(PRE, path))
        elif i > last:
            out.append(LayerOf(POST, path))
        else:
            raise StructureError(
                f"op {names[i]} (module {path or 'top'}) runs between blocks {current} and the next"
            )
    return out
