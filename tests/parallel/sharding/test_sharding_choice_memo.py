"""The memos of propagation's final choice (``choices._CHOICES``) and of legalization's
requirements (``legalize._REQUIRED``) change nothing: layers sharded with them — cold, and warm
from other models, meshes and microbatch sizes — print exactly as layers sharded without them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from distir.frontends.zoo.registry import build_from, parse_model_string
from distir.ir.dtensor import Placement, Replicate, Shard
from distir.ir.function import Module
from distir.ir.printer import print_module
from distir.ir.types import Device, DType, TensorType
from distir.ops.sharding import Strategy
from distir.parallel.layer_sharder import _DIFFERENTIATED, sharded_layers
from distir.parallel.sharding import choices, legalize, propagate

MODELS = (
    "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128",
    "llama:layers=2,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128",
    "mlp:layers=3,hidden=64",
    "transgan-hetero",
)
# (d, t, microbatch, recompute, split weight gradients): meshes with one and two sharded axes, a
# size-1 batch, recomputation and the zero-bubble split
CONFIGS = (
    (1, 2, 4, "none", False),
    (2, 2, 2, "full", True),
    (2, 1, 1, "none", False),
    (1, 4, 8, "none", True),
)


class _NoMemo(dict[object, object]):
    """A memo that never remembers: every answer is computed."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


def _texts(model_string: str) -> Iterator[str]:
    spec = parse_model_string(model_string)
    for d, t, b, recompute, split_w in CONFIGS:
        model = build_from(spec, b, DType.f32)
        for layer in sharded_layers(model, d, t, recompute, True, split_w=split_w):
            fns = [layer.fwd, layer.bwd, layer.bwd_i, layer.bwd_w]
            yield from (print_module(Module((f,))) for f in fns if f is not None)
            yield repr((layer.fwd_args, layer.bwd_args))


def _shard_all(models: tuple[str, ...]) -> dict[str, list[str]]:
    _DIFFERENTIATED.clear()  # differentiated anew: the memos meet fresh ops with equal types
    return {m: list(_texts(m)) for m in models}


def _without_memos() -> dict[str, list[str]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(propagate, "_CHOICES", _NoMemo())
        mp.setattr(legalize, "_REQUIRED", _NoMemo())
        return _shard_all(MODELS)


@pytest.mark.slow
def test_memos_change_no_sharded_layer() -> None:
    slow = _without_memos()
    choices._CHOICES.clear()
    legalize._REQUIRED.clear()
    cold = _shard_all(MODELS)
    assert cold == slow
    assert choices._CHOICES and legalize._REQUIRED  # the memos were used
    # warm, filled by the models in another order: every answer now comes from the memos
    assert _shard_all(MODELS[::-1]) == slow
    assert _shard_all(MODELS) == slow


class _Checking(dict[object, object]):
    """A memo that never answers, so every answer is computed, and checks that answers computed
    for one key agree (the key holds everything the answer depends on)."""

    def __init__(self) -> None:
        super().__init__()
        self.repeats = 0

    def get(self, key: object, default: object = None) -> object:
        return default

    def __setitem__(self, key: object, value: object) -> None:
        if key in self:
            assert self[key] == value, key
            self.repeats += 1
        super().__setitem__(key, value)


@pytest.mark.slow
def test_answers_agree_for_equal_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    choices, required = _Checking(), _Checking()
    monkeypatch.setattr(propagate, "_CHOICES", choices)
    monkeypatch.setattr(legalize, "_REQUIRED", required)
    monkeypatch.setattr(propagate, "_CHOICES_MAX", 1 << 30)
    monkeypatch.setattr(legalize, "_REQUIRED_MAX", 1 << 30)
    _shard_all(MODELS)
    assert choices.repeats > 100 and required.repeats > 100  # keys do repeat, and answers agree


def test_each_part_of_the_choice_key_can_decide() -> None:
    """``_choose`` depends on every part of its memo key besides the op's signature: the
    placements in (``have``), the fixed point's result placements (``hint``), what the other
    axes hold (``in_other``, ``out_other``), the pins and the annotated results (``tgt``)."""
    t = TensorType(DType.f32, (8, 8), Device(0))
    r, s0, s1 = Replicate(), Shard(0), Shard(1)
    keep = Strategy((s0,), (s0,))
    gather = Strategy((r,), (r,))
    other = Strategy((s0,), (s1,))
    mov = [(0, t, False)]

    def choose(
        options: list[Strategy],
        have: tuple[Placement, ...] = (s0,),
        hint: tuple[Placement, ...] = (s0,),
        in_other: tuple[tuple[Placement, ...], ...] = ((r,),),
        out_other: tuple[tuple[Placement, ...], ...] = ((r,),),
        movable: list[tuple[int, TensorType, bool]] = mov,
        tgt: tuple[tuple[int, Placement], ...] = (),
    ) -> Strategy:
        targets = [(i, t, [p]) for i, p in tgt]
        return choices._choose(options, 2, have, hint, in_other, out_other, movable, targets, tgt)

    assert choose([gather, keep]) is keep
    assert choose([gather, keep], have=(r,)) is gather  # have
    assert choose([keep, other]) is keep
    assert choose([keep, other], hint=(s1,)) is other  # hint
    assert choose([keep, gather], in_other=((s0,),)) is gather  # in_other: S(0) on two axes
    assert choose([keep, other], out_other=((s0,),)) is other  # out_other
    # pins: moving the small pinned weight costs fewer bytes than moving the large activation
    w, x = TensorType(DType.f32, (2, 2), Device(0)), TensorType(DType.f32, (64, 64), Device(0))
    move_x = Strategy((s0, r), (s0,))
    move_w = Strategy((r, s0), (s0,))
    for pinned, want in ((False, move_w), (True, move_x)):
        got = choices._choose(
            [move_x, move_w],
            2,
            (s0, s0),
            (s0,),
            ((r,), (r,)),
            ((r,),),
            [(0, w, pinned), (1, x, False)],
            [],
            (),
        )
        assert got is want
