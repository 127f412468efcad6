"""The one rule of which tensor-parallel degrees give each rank whole heads, query groups and FFN
columns (``distir.parallel.tp_split``), and the places that apply it: ``export``, ``simulate``,
the API's ``simulate`` and the search's space."""

from __future__ import annotations

import pytest

from distir.export.plan import split_sizes, tp_split_refusal
from distir.ir.types import DType
from distir.parallel.strategy import StrategyError
from distir.parallel.tp_split import dividing_degrees, split_refusal
from distir.search.profile import allowed_tp


def test_the_degrees_that_divide_every_size() -> None:
    assert dividing_degrees({"heads": 12, "ffn": 3072}) == [1, 2, 3, 4, 6, 12]
    assert dividing_degrees({"heads": 32, "kv_heads": 8, "ffn": 14336}) == [1, 2, 4, 8]


def test_a_split_head_is_named_with_the_degrees_that_work() -> None:
    why = split_refusal({"heads": 25, "ffn": 6400}, 2)
    assert why.startswith("t=2 does not divide heads=25:") and "(t dividing them all: 1, 5, 25)" in why
    assert split_refusal({"heads": 25, "ffn": 6400}, 5) == ""
    assert split_refusal({"heads": 25}, 1) == ""


@pytest.mark.parametrize(
    ("model", "sizes"),
    [
        ("gpt2-117m", {"heads": 12, "ffn": 3072}),
        ("llama3-8b", {"heads": 32, "kv_heads": 8, "ffn": 14336}),
        ("transgan-hetero", {"heads": 4}),
        # Nemotron's query groups and FFN columns bound the degree too (t = 3 ran on 8 KV heads)
        ("nemotron-15b", {"heads": 48, "kv_heads": 8, "ffn": 24576}),
        ("nemotron-8b", {"heads": 32, "ffn": 16384}),
        ("mlp-1b", {}),
        ("hf:tests/frontends/configs/gpt2-xl.json", {"heads": 25, "ffn": 6400}),
        ("hf:tests/frontends/configs/llama3-8b.json", {"heads": 32, "kv_heads": 8, "ffn": 14336}),
    ],
)
def test_the_sizes_of_each_kind_of_model(model: str, sizes: dict[str, int]) -> None:
    assert split_sizes(model) == sizes


def test_gqa_query_groups_bound_the_degree() -> None:
    model = "llama:layers=2,hidden=128,heads=8,kv_heads=2,ffn=256,vocab=64,seq=16"
    assert tp_split_refusal(model, 2) == ""
    assert "kv_heads=2" in tp_split_refusal(model, 4)


def test_the_api_simulate_refuses_a_split_head() -> None:
    import distir

    with pytest.raises(StrategyError, match=r"t=8 does not divide heads=12"):
        distir.simulate("gpt2-117m:layers=2", "d1.t8.p1.k1.1f1b", "dgx-a100", batch=8)


def test_the_search_space_keeps_whole_heads() -> None:
    from distir.frontends.zoo.registry import parse_model_string

    spec = parse_model_string("gpt2-117m:layers=2")  # 12 heads; its weights' dims split 8 ways
    assert allowed_tp(spec, DType.f32, 8) == [1, 2, 3, 4, 6]
    assert allowed_tp(
        parse_model_string("gpt:layers=2,hidden=100,heads=25,seq=16,vocab=64"), DType.f32, 8
    ) == [
        1,
        5,
    ]


def test_the_search_space_keeps_whole_query_groups_of_nemotron() -> None:
    from distir.frontends.zoo.registry import parse_model_string

    assert allowed_tp(parse_model_string("nemotron-15b:layers=2"), DType.bf16, 8) == [1, 2, 4, 8]
    assert "t=3 does not divide kv_heads=8" in tp_split_refusal("nemotron-340b", 3)
