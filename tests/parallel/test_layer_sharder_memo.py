"""``LayerSharder``'s memos (a layer's forward result types and its arguments on the mesh, once
per function and types) change nothing: the sharded layers print exactly as without them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from distir.autodiff.reverse import value_types
from distir.frontends.zoo.registry import build_from, parse_model_string
from distir.ir.function import Function, Module
from distir.ir.printer import print_module
from distir.ir.types import DType, Type
from distir.parallel import layer_sharder
from distir.parallel.layer_sharder import LayerSharder, sharded_layers

MODELS = (
    "gpt:layers=3,hidden=64,heads=4,seq=16,vocab=128",
    "llama:layers=3,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128",
    "mlp:layers=3,hidden=64",
)
# (d, t, microbatch, recompute, split weight gradients)
CONFIGS = ((1, 2, 4, "none", False), (2, 2, 2, "full", True), (2, 1, 2, "selective", False))


def _texts(model_string: str) -> list[str]:
    out = []
    for d, t, b, recompute, split_w in CONFIGS:
        model = build_from(parse_model_string(model_string), b, DType.f32)
        for layer in sharded_layers(model, d, t, recompute, True, split_w=split_w):
            fns = [layer.fwd, layer.bwd, layer.bwd_i, layer.bwd_w]
            out.extend(print_module(Module((f,))) for f in fns if f is not None)
            out.append(repr((layer.fwd_args, layer.bwd_args)))
    return out


@pytest.mark.parametrize("model", MODELS)
def test_memos_change_no_sharded_layer(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hits: list[bool] = []
    memo_on_mesh = LayerSharder._on_mesh

    def counting(self: LayerSharder, types: Sequence[Type], ann: dict[int, str]) -> tuple[Type, ...]:
        before = len(self._meshed)
        got = memo_on_mesh(self, types, ann)
        hits.append(len(self._meshed) == before)
        return got

    monkeypatch.setattr(LayerSharder, "_on_mesh", counting)
    memoized = _texts(model)
    assert any(hits)  # the repeated blocks did hit the memo

    def fresh_on_mesh(self: LayerSharder, types: Sequence[Type], ann: dict[int, str]) -> tuple[Type, ...]:
        return layer_sharder._on_mesh(types, ann, self.mesh_rep)

    def fresh_fwd_types(self: LayerSharder, fwd: Function, arg_types: Sequence[Type]) -> list[Type]:
        env = value_types(Module((fwd,)), fwd, arg_types)
        return [env[o] for o in fwd.outputs]

    monkeypatch.setattr(LayerSharder, "_on_mesh", fresh_on_mesh)
    monkeypatch.setattr(LayerSharder, "_fwd_types", fresh_fwd_types)
    assert _texts(model) == memoized
