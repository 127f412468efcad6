"""The search space: factorizations, divisibility, pins and the memory ladder."""

from __future__ import annotations

import re

import pytest

from distir.frontends.zoo.registry import parse_model_string
from distir.ir.types import DType
from distir.parallel.distribute import sharded_layers
from distir.search.profile import allowed_tp, num_layers
from distir.search.space import CP_MIN_CHUNK, CP_MIN_SEQ, LADDER, Pins, Space, SpaceError, divisors


def test_divisors_match_definition() -> None:
    for n in range(1, 80):
        assert divisors(n) == [i for i in range(1, n + 1) if n % i == 0]


def test_triples_cover_every_factorization_not_only_powers_of_two() -> None:
    sp = Space(devices=12, batch=24, n_layers=10, allowed_tp=(1, 2, 3, 4, 6, 12))
    got = set(sp.triples())
    want = {
        (d, t, p) for d in range(1, 13) for t in (1, 2, 3, 4, 6, 12) for p in range(1, 11) if d * t * p == 12
    }
    want = {x for x in want if 24 % x[0] == 0}
    assert got == want
    assert (3, 2, 2) in got  # not a power of two


def test_allowed_tp_divides_every_tp_weight_dimension() -> None:
    spec = parse_model_string("gpt:layers=2,hidden=96,heads=12,vocab=60,seq=8")
    ts = allowed_tp(spec, DType.f32, 16)
    # GPT's TP-sharded dimensions are multiples of hidden = 96 (q/k/v/o, the MLP's 4·hidden), and
    # each rank takes whole heads (12); the vocabulary (60) is sharded but never limits t
    # (Megatron pads it): t must divide 96 and 12, so 3 and 12 qualify, 5, 8 and 9 do not
    assert ts == [t for t in range(1, 17) if 12 % t == 0]
    model = spec.build(8)
    for t in (3, 12):
        layers = sharded_layers(model, 1, t)
        assert len(layers) == len(model.layers)


def test_bases_respect_batch_layers_and_schedules() -> None:
    sp = Space(devices=8, batch=32, n_layers=6, allowed_tp=(1, 2, 4, 8))
    bases = list(sp.bases())
    assert bases
    for s in bases:
        assert s.devices == 8
        assert 32 % (s.d * s.k) == 0
        assert s.p * s.v <= 6
        if s.schedule == "interleaved":
            assert s.v == 2 and s.k % s.p == 0
    assert {s.schedule for s in bases if s.p > 1} == {"gpipe", "1f1b", "interleaved", "zb1"}
    # every microbatch size of every shape, p = 1 included (gradient accumulation without a
    # pipeline), with and without sequence parallelism where there is tensor parallelism
    for d, t, p in sp.triples():
        for seq in (False, True) if t > 1 else (False,):
            got = sorted(s.k for s in bases if (s.d, s.t, s.sp, s.p, s.schedule) == (d, t, seq, p, "1f1b"))
            assert got == divisors(32 // d), (d, t, seq, p)
    assert not any(s.sp for s in bases if s.t == 1)
    pinned = Space(devices=8, batch=32, n_layers=6, allowed_tp=(1, 2, 4, 8), pins=Pins(sp=True))
    assert all(s.sp and s.t > 1 for s in pinned.bases())


@pytest.mark.parametrize(
    ("pins", "words"),
    [
        (Pins(mbs=3), "--microbatch-size 3 does not divide the batch 4 (microbatch sizes that do: 1, 2, 4)"),
        (Pins(k=3), "-k 3 does not divide the batch 4 (microbatch counts that do: 1, 2, 4)"),
        (Pins(dp=2, mbs=4), "--microbatch-size 4 does not divide the batch 2 per replica of --dp 2 "),
        (Pins(mbs=2, k=4), "--microbatch-size 2 × -k 4 = 8 samples does not divide the batch 4"),
        (
            Pins(dp=8),
            "--dp 8 does not divide the batch 4 (data-parallel degrees that do, on 8 devices: 1, 2, 4)",
        ),
        (Pins(hsdp=3), "--hsdp 3 must divide the data-parallel degree d, a divisor of the 8 devices"),
    ],
)
def test_a_microbatch_pin_that_does_not_divide_the_batch_says_what_divides(pins: Pins, words: str) -> None:
    """Not the generic "no strategy for these pins": the pin, the batch, and what divides it."""
    with pytest.raises(SpaceError, match=re.escape(words)):
        Space(8, 4, 6, (1, 2, 4, 8), pins=pins).check()


@pytest.mark.parametrize(
    ("pins", "words"),
    [
        (Pins(dp=8, tp=2), "--dp 8 × --tp 2 = 16 GPUs, but a strategy uses every one of the cluster's 8"),
        (Pins(dp=4, tp=2, pp=2), "--dp 4 × --tp 2 × --pp 2 = 16 GPUs"),
        (Pins(dp=2, tp=2, cp=1, pp=1), "--dp 2 × --tp 2 × --cp 1 × --pp 1 = 4 GPUs"),
    ],
)
def test_pinned_degrees_whose_product_is_not_the_gpus_say_so(pins: Pins, words: str) -> None:
    """Not the generic "no strategy for these pins": the pinned degrees, their product, and the
    cluster's GPUs, every one of which a strategy uses."""
    with pytest.raises(SpaceError, match=re.escape(words)):
        Space(8, 32, 6, (1, 2, 4, 8), pins=pins, seq=64).check()
    Space(8, 32, 6, (1, 2, 4, 8), pins=Pins(dp=4, tp=2), seq=64).check()


def test_d_t_and_p_pinned_short_of_the_gpus_say_so_where_context_parallelism_is_not_searched() -> None:
    """With no context parallelism searched (a sequence below --cp-from-seq), d, t and p pinned
    are every degree: their product short of the GPUs is named, not "no strategy ... (no weight
    of the model is tensor-parallel ...)", which blamed a model whose --tp 1 the user pinned."""
    words = "--dp 2 × --tp 1 × --pp 1 = 2 GPUs, but a strategy uses every one of the cluster's 8"
    with pytest.raises(SpaceError, match=re.escape(words)) as got:
        Space(8, 32, 6, (1,), pins=Pins(dp=2, tp=1, pp=1), seq=64).check()
    assert "c = 1: no context parallelism searched" in str(got.value)
    long = Space(8, 32, 6, (1,), pins=Pins(dp=2, tp=1, pp=1), seq=2**15)  # c = 4 is searched
    assert {(s.d, s.t, s.c, s.p) for s in long.bases()} == {(2, 1, 4, 1)}
    with pytest.raises(SpaceError, match=re.escape("these pins (--tp 1)")):
        Space(8, 2, 6, (1,), pins=Pins(tp=1, pp=1), seq=64).check()


def test_pins_restrict_and_bad_pins_say_why() -> None:
    sp = Space(8, 32, 6, (1, 2, 4, 8), pins=Pins(tp=2, schedule="1f1b"))
    assert all(s.t == 2 and (s.p == 1 or s.schedule == "1f1b") for s in sp.bases())
    with pytest.raises(SpaceError, match="--tp 3"):
        Space(8, 32, 6, (1, 2, 4, 8), pins=Pins(tp=3)).check()
    with pytest.raises(SpaceError, match="--pp 16"):
        Space(8, 32, 6, (1, 2, 4, 8), pins=Pins(pp=16)).check()
    with pytest.raises(SpaceError, match="--schedule"):
        Pins(schedule="fast")


def test_ladder_cheapest_first_and_pins() -> None:
    sp = Space(8, 32, 6, (1, 2, 4, 8))
    base = next(s for s in sp.bases() if s.d == 2)
    rungs = sp.ladder(base)
    assert [(s.zero, s.recompute) for s in rungs] == list(LADDER)
    single = next(s for s in sp.bases() if s.d == 1)
    assert all(s.zero == 0 for s in sp.ladder(single))
    pinned = Space(8, 32, 6, (1, 2, 4, 8), pins=Pins(zero=1))
    assert {s.zero for s in pinned.ladder(base)} == {1}


def test_pipelined_ladder_leaves_zero1_to_zero2_unless_pinned() -> None:
    """Under a pipeline with gradient accumulation ZeRO-2 holds ZeRO-1's memory (whole
    accumulated gradients) and reduce-scatters where ZeRO-1 all-reduces: no ZeRO-1 rung."""
    sp = Space(8, 32, 6, (1, 2, 4, 8))
    base = next(s for s in sp.bases() if s.d == 2 and s.p == 2 and s.k > 1)
    rungs = [(s.zero, s.recompute) for s in sp.ladder(base)]
    assert rungs == [(z, r) for z, r in LADDER if z != 1]
    one = next(s for s in sp.bases() if s.d == 2 and s.p == 2 and s.k == 1)
    assert [(s.zero, s.recompute) for s in sp.ladder(one)] == list(LADDER)
    pinned = Space(8, 32, 6, (1, 2, 4, 8), pins=Pins(zero=1))
    assert {s.zero for s in pinned.ladder(base)} == {1}


def test_num_layers_counts_the_loss_only_in_training() -> None:
    spec = parse_model_string("mlp:layers=4,hidden=8")
    assert num_layers(spec, DType.f32, True) == num_layers(spec, DType.f32, False) + 1


@pytest.mark.parametrize(
    ("space", "shape", "why"),
    [
        (
            Space(8, 64, 6, (1, 2, 4)),
            (1, 8, 1),
            "t = 8 is not a tensor-parallel degree searched here (1, 2, 4",
        ),
        (Space(8, 64, 6, (1, 2, 4, 8)), (1, 1, 8), "the model has 6 blocks, fewer than 8 stages"),
        (Space(8, 36, 6, (1, 2, 4, 8)), (8, 1, 1), "the batch 36 does not split 8 ways"),
        (Space(8, 64, 6, (1, 2, 4, 8), pins=Pins(tp=2)), (8, 1, 1), "--tp 2 is pinned"),
        (Space(8, 64, 6, (1, 2, 4, 8)), (2, 2, 1), "d·t·p = 4, not the cluster's 8 devices"),
    ],
)
def test_why_not_names_the_rule_that_leaves_a_shape_out(
    space: Space, shape: tuple[int, int, int], why: str
) -> None:
    assert (space.why_not(*shape) or "").startswith(why)
    assert shape not in set(space.triples())


def test_why_not_is_none_exactly_for_the_shapes_the_space_has() -> None:
    for space in (
        Space(12, 48, 7, (1, 2, 3, 4)),
        Space(8, 36, 3, (1, 2), pins=Pins(pp=2)),
        Space(6, 4, 9, (1, 3)),
        Space(8, 64, 6, (1, 2, 4, 8), pins=Pins(schedule="zb1")),
        Space(8, 64, 6, (1, 2, 4, 8), pins=Pins(k=16)),
        Space(8, 64, 6, (1, 2, 4, 8), train=False, pins=Pins(schedule="gpipe")),
        Space(8, 64, 5, (1, 2, 4, 8), pins=Pins(schedule="interleaved")),
    ):
        have = {(b.d, b.t, b.p) for b in space.bases()}
        for d in divisors(space.devices):
            for t in divisors(space.devices // d):
                p = space.devices // (d * t)
                assert (space.why_not(d, t, p) is None) == ((d, t, p) in have), (space, d, t, p)


def test_context_parallelism_only_for_long_sequences() -> None:
    """c > 1 from a 16K sequence on (``CP_MIN_SEQ``), each c a divisor of the devices that cuts
    the sequence into 2c chunks of at least ``CP_MIN_CHUNK`` positions; never for inference."""
    short = Space(64, 64, 32, (1, 2, 4, 8), seq=8192)
    assert short.context_degrees() == [1] and {s.c for s in short.bases()} == {1}
    long = Space(64, 64, 32, (1, 2, 4, 8), seq=131072)
    want = [c for c in divisors(64) if c == 1 or 131072 // (2 * c) >= CP_MIN_CHUNK]
    assert long.context_degrees() == want == [1, 2, 4, 8, 16, 32]
    assert CP_MIN_SEQ == 16384 and Space(64, 64, 32, (1,), seq=CP_MIN_SEQ).context_degrees()[-1] == 4
    assert Space(64, 64, 32, (1,), train=False, seq=131072).context_degrees() == [1]
    for s in long.bases():
        assert s.d * s.t * s.c * s.p == 64
    # ZeRO over the context ranks of one replica: d = 1 climbs the ZeRO rungs too
    base = next(s for s in long.bases() if (s.d, s.c) == (1, 64 // 32) and s.t == 8 and s.p == 4)
    assert any(x.zero for x in long.ladder(base))


def test_the_sequence_context_parallelism_starts_from_is_a_bound_the_user_moves() -> None:
    """``--cp-from-seq`` (``Pins.cp_from_seq``): at 8,192 positions c = 2 joins (2c = 4 chunks
    of 2,048), not c = 4 (chunks of 1,024); a bound below 1 is refused."""
    moved = Space(16, 64, 32, (1, 2, 4, 8), pins=Pins(cp_from_seq=8192), seq=8192)
    assert moved.context_degrees() == [1, 2]
    assert {s.c for s in moved.bases()} == {1, 2}
    assert Space(16, 64, 32, (1, 2, 4, 8), pins=Pins(cp_from_seq=8193), seq=8192).context_degrees() == [1]
    with pytest.raises(SpaceError, match="--cp-from-seq"):
        Pins(cp_from_seq=0)


def test_a_context_parallel_pin_must_fit_the_sequence_and_the_devices() -> None:
    assert {s.c for s in Space(16, 16, 8, (1, 2), pins=Pins(cp=2), seq=4096).bases()} == {2}
    with pytest.raises(SpaceError, match="--cp 3 does not divide"):
        Space(16, 16, 8, (1, 2), pins=Pins(cp=3), seq=4096).check()
    with pytest.raises(SpaceError, match="24 positions do not divide"):
        Space(16, 16, 8, (1, 2), pins=Pins(cp=16), seq=24).check()
    with pytest.raises(SpaceError, match="no sequence"):
        Space(16, 16, 8, (1, 2), pins=Pins(cp=2)).check()
    space = Space(16, 16, 8, (1, 2), seq=4096)
    assert "c = 2 is not searched" in (space.why_not(8, 1, 1, 2) or "")


def test_context_parallel_plans_are_what_distribute_builds() -> None:
    """c > 1 with and without sequence parallelism (with t > 1: the sequence nested over cp and
    tp), with data parallelism, several sequences per microbatch and, where a stage's replicas
    span more than a node, HSDP over a node's replicas and their context ranks (``distribute``
    builds them all; the loss runs on (batch, sequence) rows: ``distir.parallel.context_model``)."""
    space = Space(16, 16, 8, (1, 2, 4), node_devices=8, seq=65536)
    cps = [s for s in space.strategies() if s.c > 1]
    assert cps and {s.c for s in cps} >= {2, 4}
    assert any(s.sp for s in cps) and all(s.t > 1 for s in cps if s.sp)
    assert {(s.d, s.t, s.c, s.p, s.k, s.schedule) for s in cps if s.sp} == {
        (s.d, s.t, s.c, s.p, s.k, s.schedule) for s in cps if s.t > 1 and not s.sp
    }
    assert any(s.d > 1 for s in cps) and any(s.d * s.k < 16 for s in cps)  # several sequences
    hsdp = {(s.d, s.t, s.c, s.shard_group) for s in cps if s.shard_group is not None}
    assert (8, 1, 2, 4) in hsdp  # 8 replicas of 2 GPUs: a node holds 4 of them
    assert all(d * t * c > 8 and h * t * c == 8 for d, t, c, h in hsdp)
    assert any(s.sp for s in space.strategies() if s.c == 1)  # the rest of the space is unchanged
    both = Space(16, 16, 8, (1, 2, 4), node_devices=8, pins=Pins(cp=2, sp=True), seq=65536)
    both.check()
    assert all(s.c == 2 and s.sp and s.t > 1 for s in both.strategies())
    pinned = Space(16, 16, 8, (1, 2, 4), node_devices=8, pins=Pins(cp=2, dp=8, hsdp=4), seq=65536)
    pinned.check()
    assert {(s.d, s.c, s.shard_group) for s in pinned.strategies()} == {(8, 2, 4)}


def test_a_model_without_tensor_parallel_weights_is_searched_at_t1_only() -> None:
    """An imported module whose weight names match no placement pattern (``inp``, ``fc``,
    ``out``) shards nothing under t > 1: each rank would compute the whole model, as fast as t = 1
    on t times the GPUs. Only t = 1 is searched, and a --tp pin says why."""
    pytest.importorskip("torch")
    spec = parse_model_string("tests.frontends.torch_models:mlp")
    assert allowed_tp(spec, DType.f32, 8) == [1]
    sp = Space(devices=8, batch=8, n_layers=3, allowed_tp=(1,), pins=Pins(tp=2))
    words = r"no weight of the model is tensor-parallel .* --tp-layout auto, if given, sharded none"
    with pytest.raises(SpaceError, match=words):
        sp.check()


def test_a_model_whose_attention_takes_no_ring_searches_no_context_parallelism() -> None:
    """The explicit attention form (a mask by index) cannot run context-parallel
    (``context_refusal``): the space has c = 1 only at a long sequence, and a pinned c says why."""
    from dataclasses import replace

    from distir.hardware.cluster import parse_cluster
    from distir.search.run import SearchRequest, build_space

    model = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=64,seq=32768"
    req = SearchRequest(model=model, cluster="h100", batch=8, dtype="bf16", precision="mixed")
    assert build_space(req, parse_cluster("h100")).context_degrees() != [1]
    naive = replace(req, model=f"{model},attention=naive")
    space = build_space(naive, parse_cluster("h100"))
    assert space.context_degrees() == [1] and "masks by index" in space.no_context
    pinned = build_space(replace(naive, pins=Pins(cp=2)), parse_cluster("h100"))
    with pytest.raises(SpaceError, match=r"--cp 2: @\w+ masks by index"):
        pinned.check()


def test_distir_ladders_made_on_demand_equal_the_space_ladders() -> None:
    """The screen's ladders under distir's trainer make each rung's strategy when asked
    (``_Ladder``): the same strategies, in the same order, as ``Space.ladder``."""
    from distir.hardware.cluster import parse_cluster
    from distir.search.run import SearchRequest, _trainer_ladders, build_space

    model = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"
    req = SearchRequest(model=model, cluster="p3.8xlarge:2", batch=8)
    space = build_space(req, parse_cluster(req.cluster))
    bases = list(space.bases())
    lazy = _trainer_ladders(req, space, bases)
    assert [list(ladder) for ladder in lazy] == [space.ladder(b) for b in bases]
    assert sum(map(len, lazy)) > len(bases)  # rungs above the first are in the space
    assert all(ladder[-1] == space.ladder(b)[-1] for ladder, b in zip(lazy, bases, strict=True) if ladder)


@pytest.mark.parametrize(
    ("pins", "words"),
    [
        (Pins(cp=2), "--cp 2: context parallelism runs training steps only, not inference"),
        (Pins(schedule="zb1"), "--schedule zb1: inference runs its pipeline in 1f1b order"),
        (Pins(schedule="interleaved"), "--schedule interleaved: inference runs its pipeline in 1f1b order"),
    ],
)
def test_inference_pins_what_it_cannot_run_are_refused(pins: Pins, words: str) -> None:
    """Refused before the screen: context parallelism does not build an inference program
    (every exact simulation failed), and a pinned zero-bubble or interleaved schedule left the
    space empty under a message about tensor parallelism."""
    space = Space(8, 16, 4, (1, 2), train=False, pins=pins, seq=1024)
    with pytest.raises(SpaceError, match=re.escape(words)):
        space.check()
