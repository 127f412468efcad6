"""Mixture-of-experts blocks as leaves of the trace: each becomes one registry ``MoE`` op.

A sparse MoE block routes each token to its top-k experts with data-dependent indexing
(``torch.where`` on the routing, per-expert gathers and ``index_add_``), which torch.export
cannot trace on fake tensors (the number of tokens per expert is not known). So while a module
is traced (``moe_leaves``), every block recognized as one has its ``forward`` replaced by one call
of the custom torch op ``distir::moe`` (its fake implementation: a result shaped like the input),
which ``aten_map`` writes as ``distir.ops.moe``'s ``MoE`` op. Its eager implementation is
``distir.ops.moe.moe_torch`` (HF's loop over experts), so the patched module still runs.

A block is recognized by structure, as Hugging Face's Mixtral lays it out: exactly two children,
``gate`` (a top-k router: ``weight`` (E, H), ``top_k``, optionally ``norm_topk_prob``) and
``experts`` (``gate_up_proj`` (E, 2F, H) holding the gate then the up projection, ``down_proj``
(E, H, F), a SiLU activation, no biases). Qwen2-MoE's block adds a shared expert
(``shared_expert``, a dense MLP every token runs) scaled by a sigmoid gate (``shared_expert_gate``,
a (1, H) linear layer): there the routed experts are the leaf and the shared expert and its gate
are traced as the rest of the model (``_forward``: routed + sigmoid(gate(x))·shared(x), as
transformers' ``Qwen2MoeSparseMoeBlock``). A block with other parts or another expert layout is
refused with a one-line ``StructureError``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, NamedTuple

from distir.frontends.torch_import.errors import StructureError

OP = "distir::moe"
SHARED = ("shared_expert", "shared_expert_gate")  # Qwen2-MoE's gated shared expert
SCHEMA = "(Tensor x, Tensor wg, Tensor w1, Tensor w3, Tensor w2, int top_k, bool normalize) -> Tensor"


class MoEBlock(NamedTuple):
    """A recognized block: its module path and module, k, whether weights are renormalized, and
    whether it has Qwen2-MoE's gated shared expert."""

    path: str
    module: Any
    top_k: int
    normalize: bool
    shared: bool = False


@functools.cache
def moe_op() -> Any:
    """The custom op ``distir::moe`` (registered with torch once)."""
    import torch

    from distir.ops.moe import moe_torch

    @torch.library.custom_op(OP, mutates_args=(), schema=SCHEMA)
    def moe(x: Any, wg: Any, w1: Any, w3: Any, w2: Any, top_k: int, normalize: bool) -> Any:
        return moe_torch(torch, x, wg, w1, w3, w2, top_k, normalize)

    @moe.register_fake
    def _(x: Any, wg: Any, w1: Any, w3: Any, w2: Any, top_k: int, normalize: bool) -> Any:
        return torch.empty_like(x)

    return moe


def _looks_like_moe(m: Any) -> bool:
    return hasattr(m, "gate") and hasattr(m, "experts") and hasattr(m.experts, "down_proj")


def _is_silu(f: Any) -> bool:
    """Whether ``f`` is SiLU (torch's module, or transformers' ``SiLUActivation``)."""
    import torch

    return isinstance(f, torch.nn.SiLU) or type(f).__name__ == "SiLUActivation"


def _block(path: str, m: Any) -> MoEBlock:
    import torch

    where = f"mixture-of-experts block {path} ({type(m).__name__})"
    children = {name for name, _ in m.named_children()}
    shared = children == {"gate", "experts", *SHARED}
    if children != {"gate", "experts"} and not shared:
        extra = ", ".join(sorted(children - {"gate", "experts"})) or "none"
        raise StructureError(
            f"{where}: only a router and experts (and Qwen2-MoE's gated shared expert) are supported, "
            f"it also has: {extra}"
        )
    gate, ex = m.gate, m.experts
    gu, down = getattr(ex, "gate_up_proj", None), getattr(ex, "down_proj", None)
    layout_ok = (
        isinstance(gu, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and gu.dim() == 3
        and down.dim() == 3
        and gu.shape[1] == 2 * down.shape[2]
        and getattr(ex, "is_concatenated", True)
        and not getattr(ex, "is_transposed", False)
        and not getattr(ex, "has_bias", False)
        and _is_silu(getattr(ex, "act_fn", None))
    )
    if not layout_ok:
        raise StructureError(
            f"{where}: only SwiGLU experts with gate_up_proj (E, 2F, H) and down_proj (E, H, F), "
            "no bias, are supported"
        )
    k = getattr(gate, "top_k", None) or getattr(m, "top_k", None)
    if not isinstance(getattr(gate, "weight", None), torch.Tensor) or not isinstance(k, int):
        raise StructureError(f"{where}: its router has no weight (E, H) and top_k")
    return MoEBlock(path, m, k, bool(getattr(gate, "norm_topk_prob", True)), shared)


def moe_blocks(module: Any) -> list[MoEBlock]:
    """The MoE blocks of ``module`` (module docstring); an unsupported one raises."""
    return [_block(path, m) for path, m in module.named_modules() if _looks_like_moe(m)]


def _forward(block: MoEBlock, hidden_states: Any) -> Any:
    import torch

    m = block.module
    gu, f = m.experts.gate_up_proj, m.experts.down_proj.shape[2]
    w1, w3 = gu[:, :f], gu[:, f:]
    out = moe_op()(hidden_states, m.gate.weight, w1, w3, m.experts.down_proj, block.top_k, block.normalize)
    if block.shared:  # Qwen2-MoE: every token also through the shared expert, scaled by its gate
        gate = torch.sigmoid(m.shared_expert_gate(hidden_states))
        out = out + gate * m.shared_expert(hidden_states)
    return out


@contextlib.contextmanager
def moe_leaves(module: Any) -> Iterator[list[MoEBlock]]:
    """Within this context every MoE block of ``module`` runs as one ``distir::moe`` call."""
    blocks = moe_blocks(module)
    for b in blocks:
        b.module.forward = functools.partial(_forward, b)
    try:
        yield blocks
    finally:
        for b in blocks:
            del b.module.forward


__all__ = ["OP", "MoEBlock", "moe_blocks", "moe_leaves", "moe_op"]
