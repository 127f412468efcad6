"""Abstract type inference is memoized across domains (``distir.ops.infer_memo.abstract_types``):
every type it gives, and every figure of a simulation or a layer profile planned with it, is what
inferring every op anew gives (``MEMO_TYPES = False``)."""

from __future__ import annotations

import pytest

from distir.autodiff.reverse import value_types
from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Module
from distir.ops import infer_memo as shapes
from distir.parallel.distribute import sharded_layers
from distir.search.profile import Profiler

GPT = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"
TRANSGAN = "transgan:wide_layers=2,narrow_layers=3,dim=256,bottom=2,window=8,latent=16,heads=4"


def _all_types(name: str, t: int) -> list[dict[object, object]]:
    out = []
    for layer in sharded_layers(parse_model_string(name).build(2), 1, t, "none", sp=t > 1 and name == GPT):
        for fn, args in ((layer.fwd, layer.fwd_args), (layer.bwd, layer.bwd_args)):
            if fn is not None:
                out.append(value_types(Module((fn,)), fn, args))
    return out


@pytest.mark.parametrize("name", [GPT, TRANSGAN])
@pytest.mark.parametrize("t", [1, 2])
def test_memoized_types_are_those_inferred_anew(name: str, t: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shapes, "_INFERRED", {})
    memo = _all_types(name, t)
    again = _all_types(name, t)  # answered from the memo
    assert shapes._INFERRED
    monkeypatch.setattr(shapes, "MEMO_TYPES", False)
    reference = _all_types(name, t)
    # the same functions' values: compare types by value name and position
    for got, ref, hit in zip(memo, reference, again, strict=True):
        assert list(map(str, got.values())) == list(map(str, ref.values()))
        assert list(got.values()) == list(ref.values()) == list(hit.values())


@pytest.mark.parametrize("name", [GPT, TRANSGAN])
def test_profiles_with_memoized_types_equal_those_inferred_anew(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layer profiles (sharding, differentiation, the simulator's planning on two device kinds)
    are the same with the memo as with every op inferred anew."""
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    cases = ((1, 2, [0], "none", False), (2, 2, [0, 1], "none", name == GPT), (2, 2, [4, 5], "full", False))

    def profiles() -> list[object]:
        prof = Profiler(spec, cluster)
        return [prof.layers(t, b, gpus, rec, sp) for t, b, gpus, rec, sp in cases]

    monkeypatch.setattr(shapes, "_INFERRED", {})
    memo = profiles()
    monkeypatch.setattr(shapes, "MEMO_TYPES", False)
    assert memo == profiles()


@pytest.mark.parametrize(
    "name", [GPT, TRANSGAN, "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=128,seq=16"]
)
@pytest.mark.parametrize("t", [1, 2])
def test_flat_types_are_the_interpreters(name: str, t: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``value_types`` of a flat body without known-value rules (``flat_types``) is what the
    interpreter gives: every value's type, in the same order."""
    from distir.autodiff import reverse
    from distir.interp.shapes import flat_types

    walked = 0
    model = parse_model_string(name).build(2)
    fns = [(f, a) for L in sharded_layers(model, 1, t) for f, a in ((L.fwd, L.fwd_args), (L.bwd, L.bwd_args))]
    for fn, args in fns:
        if fn is None:
            continue
        fast = flat_types(fn, args)
        walked += fast is not None
        monkeypatch.setattr(reverse, "flat_types", lambda fn, args: None)
        ref = value_types(Module((fn,)), fn, args)
        monkeypatch.undo()
        assert fast is None or list(fast.items()) == list(ref.items())
        assert value_types(Module((fn,)), fn, args) == ref
    assert walked > 0
    assert flat_types(fns[0][0], fns[0][1][:-1]) is None  # a wrong call: the interpreter reports it
