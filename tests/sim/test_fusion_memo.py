"""``fused_links``: ``fused_inputs`` looked up by a body's structure gives what ``fused_inputs``
computes for that very body — on random programs, on every layer function the search probes
(bodies alike at other microbatch sizes and tensor-parallel degrees share one entry), and on
bodies whose structure differs only where the links depend on it; asked again for the same
body (the memo by identity), the same links. And ``fused_inputs``' screen (``_may_link``, which
rules out bodies where no op may join) gives the links of its bulk pass alone, and so does
``fused_links``' (before a body's structure is read), on random programs and on every function
of distributed programs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from distir.autodiff.train import Optimizer
from distir.frontends.zoo.registry import build_model, parse_model_string
from distir.ir import Module, parse_module
from distir.ir.ops import Op
from distir.ir.types import DType
from distir.parallel.distribute import distribute, sharded_layers
from distir.parallel.layer_sharder import split_backward
from distir.parallel.strategy import parse_strategy
from distir.sim.fusion import _code, _may_link, body_structure, fused_inputs, fused_links
from sim.gen_programs import Feats, programs


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(Feats(max_ops=12)))
def test_links_by_structure_are_the_links_of_random_bodies(m: Module) -> None:
    for fn in m.functions:
        assert fused_links(fn) == fused_inputs(fn)
        assert fused_links(fn) == fused_inputs(fn)  # from the memo
        # without GEMM epilogues: its own memo entries, not the links with them
        assert fused_links(fn, False) == fused_inputs(fn, False)
        assert fused_links(fn, False) == fused_inputs(fn, False)


@pytest.mark.parametrize(
    "name",
    [
        "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=129",
        "transgan:wide_layers=2,narrow_layers=3,dim=256,bottom=2,window=8,latent=16,heads=4",
    ],
)
def test_links_by_structure_are_the_links_of_every_probed_layer(name: str) -> None:
    """The layer functions at several microbatch sizes and TP degrees (which share entries: at
    least one lookup hits a body met before) each get their own body's links."""
    spec = parse_model_string(name)
    structures = []
    for b in (1, 2, 4):
        for t in (1, 2):
            for L in sharded_layers(spec.build(b), 1, t):
                fns = [L.fwd]
                if L.bwd is not None and L.vjp is not None:
                    fns += [L.bwd, *split_backward(L.bwd, 1 if 0 in L.vjp.wrt else 0, L.bwd_args)]
                for fn in fns:
                    structures.append(body_structure(fn))
                    assert fused_links(fn) == fused_inputs(fn)
    assert len(set(structures)) < len(structures)


def test_bodies_that_differ_in_their_wiring_have_other_structures() -> None:
    """Whether a result has another use, or which input a pointwise op reads, tells bodies apart."""
    m = parse_module(
        """
        func @a(%x: Tensor[f32, (8, 16), d0], %w: Tensor[f32, (16, 16), d0]) {
          %y = MatMul(%x, %w)
          %z = Relu(%y)
          return %z
        }
        func @b(%x: Tensor[f32, (8, 16), d0], %w: Tensor[f32, (16, 16), d0]) {
          %y = MatMul(%x, %w)
          %z = Relu(%y)
          return %z, %y
        }
        func @c(%x: Tensor[f32, (8, 16), d0], %w: Tensor[f32, (16, 16), d0]) {
          %y = MatMul(%x, %w)
          %z = Relu(%x)
          return %z, %y
        }
        """
    )
    fns = list(m.functions)
    assert len({body_structure(f) for f in fns}) == 3
    for fn in fns:
        assert fused_links(fn) == fused_inputs(fn)
    assert fused_links(fns[0]) != fused_links(fns[1])  # the shared result is not sole


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(programs(Feats(max_ops=12)))
def test_the_screen_keeps_every_link_of_random_bodies(m: Module) -> None:
    for fn in m.functions:
        for epilogues in (True, False):
            plain = fused_inputs(fn, epilogues, screen=False)
            assert fused_inputs(fn, epilogues) == plain
            assert fused_links(fn, epilogues) == plain == fused_links(fn, epilogues, screen=False)


@pytest.mark.parametrize(
    ("model", "strategy", "options"),
    [
        ("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64", "d2.t2.sp.p2.k4.zb1", {}),
        ("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64", "d2.t1.p2.k2.1f1b.z3", {}),
        ("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64", "d2.t1.p2.k3.1f1b", {"grad_accum_fusion": True}),
        ("llama:layers=2,hidden=64,heads=4,kv_heads=2,seq=16,vocab=128", "d2.t2.p1.k2.1f1b.z1", {}),
        ("transgan-hetero:wide_layers=2,narrow_layers=2", "d2.t1.p2.k2.zb1", {}),
    ],
)
def test_the_screen_keeps_every_link_of_distributed_programs(
    model: str, strategy: str, options: dict[str, bool]
) -> None:
    """Every function of the program (layers, chunks, entry): the same links with the screen
    as without; the screen answers for some bodies (the entry and chunks: no op joins there),
    and the layers have links (the bulk pass ran)."""
    s = parse_strategy(strategy)
    mixed = bool(options)
    m = build_model(model, batch=2 * s.d * s.k, dtype=DType.bf16 if mixed else DType.f32)
    prog = distribute(
        m, s, Optimizer("adam"), comm_streams=True, precision="mixed" if mixed else "pure", **options
    )
    linked = 0
    for fn in prog.functions:
        for epilogues in (True, False):
            got = fused_inputs(fn, epilogues)
            assert got == fused_inputs(fn, epilogues, screen=False), fn.name
            assert fused_links(fn, epilogues) == got == fused_links(fn, epilogues, screen=False), fn.name
            linked += any(got)
    assert linked
    entry = prog.entry.body  # ruled out by the screen itself, not found empty by the bulk pass
    assert not _may_link(entry, [_code(x.name if type(x) is Op else "") for x in entry])
