"""Layer profiles: the distinct-layer reduction changes nothing a profile says."""

from __future__ import annotations

import itertools
import re

import pytest

import distir.search.profile as profile_module
from distir.autodiff.train import layer_types
from distir.frontends.zoo.model import check_model
from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.ir.function import Function
from distir.ir.printer import print_function
from distir.ir.types import DType
from distir.parallel.distribute import ShardedLayer, sharded_layers
from distir.search.distinct import Reduced, distinct_layers
from distir.search.profile import LayerProfile, Profiler
from distir.sim.probe import probe as fast_probe

GPT = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"
MODELS = [
    GPT,
    "mlp:layers=4,hidden=64",
    "llama:layers=3,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=128,seq=16",
    "transgan:wide_layers=2,narrow_layers=3,dim=256,bottom=2,window=8,latent=16,heads=4",
]


class _FullProfiler(Profiler):
    """The profiler without the reduction: every layer call of the full model sharded and probed."""

    def model(self, b: int, t: int = 1) -> Reduced:
        spec = self.form.spec_at(self.spec, t)
        got = self._models.get((b, spec))
        if got is None:
            m = spec.build(b, self.dtype)
            got = self._models[(b, spec)] = Reduced(m, tuple(range(len(m.layers))))
        return got


def _text(fn: Function | None) -> str | None:
    # function names are numbered in order of appearance, which the reduction changes
    return None if fn is None else re.sub(r"@[A-Za-z0-9_]+", "@f", print_function(fn))


@pytest.mark.parametrize("name", MODELS)
def test_reduced_model_keeps_the_contract_and_stands_for_every_layer(name: str) -> None:
    model = parse_model_string(name).build(4)
    red = distinct_layers(model)
    check_model(red.model)
    full_types, red_types = layer_types(model), layer_types(red.model)
    calls, kept = model.layers, red.model.layers
    assert len(red.rep) == len(calls)
    assert red.rep[0] == 0 and red.rep[-1] == len(kept) - 1 and red.rep[-2] == len(kept) - 2
    assert sorted(set(red.rep)) == list(range(len(kept)))
    for i, r in enumerate(red.rep):
        assert calls[i].callee == kept[r].callee
        assert full_types[i] == red_types[r]
    if name == GPT:
        assert red.dropped == 3  # four identical blocks: one stays


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(("t", "recompute"), [(1, "none"), (2, "selective"), (4, "full")])
def test_reduced_layers_shard_to_the_same_functions(name: str, t: int, recompute: str) -> None:
    model = parse_model_string(name).build(2)
    red = distinct_layers(model)
    full = sharded_layers(model, 1, t, recompute)
    mine = sharded_layers(red.model, 1, t, recompute)
    for i, layer in enumerate(full):
        other = mine[red.rep[i]]
        assert (layer.fwd_args, layer.bwd_args) == (other.fwd_args, other.bwd_args)
        assert _text(layer.fwd) == _text(other.fwd)
        assert _text(layer.bwd) == _text(other.bwd)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("train", [True, False])
def test_profiles_equal_those_of_the_full_model(name: str, train: bool) -> None:
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    fast, ref = Profiler(spec, cluster, train=train), _FullProfiler(spec, cluster, train=train)
    for t, b, gpus, rec in ((1, 1, [0], "none"), (2, 4, [4, 5], "selective"), (2, 3, [0, 1], "none")):
        got: list[LayerProfile] = fast.layers(t, b, gpus, rec)
        want = ref.layers(t, b, gpus, rec)
        assert got == want
    assert fast.probes <= ref.probes


class _ShardingProfiler(Profiler):
    """The profiler that shards even at one device per group (``sharded_layers`` on a 1 x 1 mesh)."""

    def sharded(self, t: int, b: int, recompute: str, sp: bool = False) -> list[ShardedLayer]:
        key = (t, b, recompute, sp)
        if key not in self._layers:
            self._layers[key] = sharded_layers(self.model(b).model, 1, t, recompute, self.train, sp=sp)
        return self._layers[key]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("train", [True, False])
def test_unsharded_profiles_equal_those_of_a_one_device_mesh(name: str, train: bool) -> None:
    """Without tensor parallelism the profiler skips sharding (``unsharded_layers``): every figure
    is that of the layers sharded on a 1 x 1 mesh, whose Redistributes move nothing."""
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    fast, ref = Profiler(spec, cluster, train=train), _ShardingProfiler(spec, cluster, train=train)
    for b, gpus, rec in ((1, [0], "none"), (3, [4], "selective"), (4, [0], "full")):
        assert fast.layers(1, b, gpus, rec) == ref.layers(1, b, gpus, rec)
        # the shortcut is taken: no Redistribute in the layers profiled
        for layer in fast.sharded(1, b, rec):
            for fn in (layer.fwd, layer.bwd):
                assert fn is None or all(op.name != "Redistribute" for op in fn.body)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("train", [True, False])
def test_shared_plans_give_the_profiles_of_probes_planned_anew(name: str, train: bool) -> None:
    """The probes of one layer function plan on one domain (``SharedPlans``): every figure is
    that of probes each planned on its own, on homogeneous and mixed TP groups, mixed precision."""
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    shared = Profiler(spec, cluster, train=train)
    alone = Profiler(spec, cluster, train=train, share_plans=False)
    cases = (
        (1, 2, [0], "none", False),
        (2, 4, [4, 5], "full", True),
        (4, 3, [2, 3, 4, 5], "selective", False),
    )
    for t, b, gpus, rec, sp in cases:
        sp = sp and spec.build(1, DType.f32).seq_dim is not None  # sp needs a sequence dim
        got: list[LayerProfile] = shared.layers(t, b, gpus, rec, sp)
        assert got == alone.layers(t, b, gpus, rec, sp)
    assert shared.probes == alone.probes
    # shared (inference probes each function once): a later probe on a kept domain, its key's
    # (``SharedPlans``) or its group's (``GroupPlans``)
    group = shared._group
    assert shared._shared.hits > 0 or (group is not None and group.hits > 0) or not train


@pytest.mark.parametrize("fill", [247, 251])
def test_probes_do_not_depend_on_what_the_sharders_bounded_memos_hold(
    fill: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layers sharing a backward share its input-gradient part within a profiler, so the probes
    run are the same whether or not ``split_backward``'s bounded memo (``_SPLITS``, cleared
    when full) is cleared midway: filled so that it is (this profiling adds 11 entries), at
    two points of it."""
    import distir.parallel.layer_sharder as sharder

    def probes(junk: int) -> int:
        monkeypatch.setattr(sharder, "_SPLITS", {("junk", i): None for i in range(junk)})
        p = Profiler(parse_model_string("mlp"), parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1"))
        for t, b, gpus, rec in (
            (1, 2, [0], "none"),
            (2, 4, [4, 5], "full"),
            (4, 3, [2, 3, 4, 5], "selective"),
        ):
            p.layers(t, b, gpus, rec)
        return p.probes

    assert probes(fill) == probes(0)


@pytest.mark.parametrize("name", [*MODELS, "transgan-hetero"])
def test_probes_on_one_domain_per_group_give_the_profiles_of_a_domain_per_function(name: str) -> None:
    """The probes of one layers key on one TP group plan on one domain, its units assumed once
    (``Profiler.one_domain``, ``distir.sim.probe.GroupPlans``): every figure is that of a domain
    per function and arguments, on homogeneous, other-kind and mixed groups, uneven shards
    (TransGAN's: units assumed anew where the group's do not hold) among them."""
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    one = Profiler(spec, cluster)
    per_fn = Profiler(spec, cluster, one_domain=False)
    has_seq = spec.build(1, DType.f32).seq_dim is not None
    hits = failed = 0
    for t, b, rec, sp in ((1, 2, "none", False), (2, 3, "full", has_seq), (4, 1, "selective", False)):
        for gpus in ([0, 1, 2, 3][:t], [4, 5, 6, 7][:t], [2, 3, 4, 5][:t]):
            got: list[LayerProfile] = one.layers(t, b, gpus, rec, sp)
            assert got == per_fn.layers(t, b, gpus, rec, sp)
            assert one._group is not None
            hits += one._group.hits
            failed += one._group.failed
    assert one.probes == per_fn.probes
    assert hits > 0
    assert failed > 0 or name != "transgan-hetero"  # the path of units assumed anew, taken


@pytest.mark.parametrize("name", [GPT, MODELS[3]])
def test_probes_of_many_keys_sharing_records_give_the_profiles_planned_anew(name: str) -> None:
    """Every probe on one TP group takes the op records of the probes before it (``SharedRecords``:
    forward, backward and input-gradient parts, with and without sequence parallelism, other
    recomputations): the profiles are those of probes each planned on its own."""
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    shared = Profiler(spec, cluster)
    alone = Profiler(spec, cluster, share_plans=False)
    has_seq = spec.build(1, DType.f32).seq_dim is not None
    keys = [(t, b, rec) for t in (1, 2) for b in (1, 2) for rec in ("none", "full")]
    for (t, b, rec), sp in itertools.product(keys, (False, True)):
        if sp and (t == 1 or not has_seq):
            continue
        for gpus in ([0, 1][:t], [4, 5][:t]):
            got: list[LayerProfile] = shared.layers(t, b, gpus, rec, sp)
            assert got == alone.layers(t, b, gpus, rec, sp)
    assert shared._records.taken > 0


def test_unit_models_build_the_model_at_one_sample_once_within_the_block() -> None:
    """Inside ``unit_models`` (a search) the model at one sample is built once per (spec, dtype)
    and is ``build_from``'s; outside, every call builds it anew (a model file edited between two
    searches is read again)."""
    from distir.frontends.zoo.registry import build_from
    from distir.search.profile import unit_model, unit_models

    spec = parse_model_string(GPT)
    outside = unit_model(spec, DType.f32)
    assert unit_model(spec, DType.f32) is not outside
    with unit_models():
        first = unit_model(spec, DType.f32)
        assert unit_model(spec, DType.f32) is first
        assert unit_model(spec, DType.bf16) is not first
        with unit_models():  # nested: the same scope
            assert unit_model(spec, DType.f32) is first
    assert unit_model(spec, DType.f32) is not first
    expected = build_from(spec, 1, DType.f32)
    assert print_function(first.forward) == print_function(expected.forward)
    assert first.weights == expected.weights


@pytest.mark.parametrize("name", [GPT, MODELS[3]])
def test_memory_figures_shared_across_device_kinds_equal_those_probed_anew(name: str) -> None:
    """A TP group of another device kind (T4s after V100s), same runtime memory and arrangement,
    takes the memory-only probes' figures of the first kind's (``Profiler.share_kinds``): every
    figure is that of probing each kind anew, and fewer layers are simulated."""
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    assert cluster.device_spec(0).runtime == cluster.device_spec(4).runtime  # else nothing to share
    shared = Profiler(spec, cluster)
    anew = Profiler(spec, cluster, share_kinds=False)
    has_seq = spec.build(1, DType.f32).seq_dim is not None
    for t, b, rec, sp in ((1, 2, "none", False), (2, 1, "full", False), (2, 2, "none", has_seq)):
        for gpus in ([0, 1][:t], [4, 5][:t], [6, 7][:t], [3, 4][:t]):  # V100s, T4s, T4s, mixed
            got: list[LayerProfile] = shared.layers(t, b, gpus, rec, sp)
            assert got == anew.layers(t, b, gpus, rec, sp)
    assert shared.probes < anew.probes


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("train", [True, False])
def test_probes_from_call_summaries_equal_simulated_probes(
    name: str, train: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probes' figures worked out from the call's summary (``distir.sim.probe``) are those of
    simulating each probe program, float for float, on homogeneous, other-kind and mixed TP
    groups, with sequence parallelism and recomputation (``Profiler(fast_probes=False)``); the
    fast path answers most probes (it is not falling back to ``simulate``)."""
    answered: list[bool] = []

    def counted(*args: object, **kwargs: object) -> object:
        got = fast_probe(*args, **kwargs)
        answered.append(got is not None)
        return got

    monkeypatch.setattr(profile_module, "probe", counted)
    spec = parse_model_string(name)
    cluster = parse_cluster("p3.8xlarge:1+g4dn.12xlarge:1")
    fast = Profiler(spec, cluster, train=train)
    simulated = Profiler(spec, cluster, train=train, fast_probes=False)
    has_seq = spec.build(1, DType.f32).seq_dim is not None
    for t, b, rec, sp in ((1, 2, "none", False), (2, 3, "full", has_seq), (4, 1, "selective", False)):
        for gpus in ([0, 1, 2, 3][:t], [4, 5, 6, 7][:t], [2, 3, 4, 5][:t]):
            got: list[LayerProfile] = fast.layers(t, b, gpus, rec, sp)
            assert got == simulated.layers(t, b, gpus, rec, sp)
    assert fast.probes == simulated.probes
    assert sum(answered) > len(answered) / 2


def test_profiler_counts_the_cpu_of_what_it_computes_only() -> None:
    """``Profiler.cpu_s`` counts the profiles computed in this process, ``shard_cpu_s`` the
    differentiation and sharding among them (a part of it); a memoized key adds nothing, nor does
    a TP group of the same kind (the same key)."""
    prof = Profiler(parse_model_string(GPT), parse_cluster("p3.8xlarge:1"))
    assert (prof.cpu_s, prof.shard_cpu_s) == (0.0, 0.0)
    first = prof.layers(2, 2, [0, 1])
    once = (prof.cpu_s, prof.shard_cpu_s)
    assert 0.0 <= once[1] <= once[0]
    assert prof.layers(2, 2, [2, 3]) is first
    assert (prof.cpu_s, prof.shard_cpu_s) == once
    prof.layers(1, 2, [0])  # another key: counted on top
    assert prof.cpu_s >= once[0] and prof.shard_cpu_s >= once[1]
