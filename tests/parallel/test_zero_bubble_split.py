"""A zero-bubble layer split (``layer_sharder.split_backward``): the input-gradient part carries
sequence-parallel slices, never gathered copies, to the weight-gradient part, which gathers them
again (as Megatron-style weight-gradient stores do); so what a layer carries per device is the
same whether its plan shares one gather between the two parts (at the global microbatch d·b with
the batch sharded over dp) or not (one replica at b = 1)."""

from __future__ import annotations

import pytest

from distir.autodiff.reverse import value_types
from distir.frontends.zoo.registry import build_from, parse_model_string
from distir.ir.dtensor import DTensorType, Shard
from distir.ir.function import Module
from distir.ir.types import DType
from distir.parallel.layer_sharder import ShardedLayer, sharded_layers
from distir.sim.layout import piece_bytes

LLAMA = "llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=512,seq=64"


def _carried(L: ShardedLayer) -> list[tuple[float, bool]]:
    """Per value ``L``'s input-gradient part carries to its weight part: its bytes per device and
    whether it is an activation (rank 3) no mesh axis shards."""
    assert L.bwd_i is not None and L.bwd is not None
    env = value_types(Module((L.bwd_i,)), L.bwd_i, L.bwd_args)
    out = []
    for v in L.bwd_i.outputs[len(L.bwd_i.outputs) - L.n_carried :]:
        t = env[v]
        assert isinstance(t, DTensorType)
        out.append((piece_bytes(t, 0), t.rank == 3 and not any(isinstance(p, Shard) for p in t.placements)))
    return out


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_carried_bytes_do_not_depend_on_the_data_parallel_plan(recompute: str) -> None:
    """One sample per replica: the layer sharded on one replica (b = 1) and on two (global
    microbatch 2, batch sharded over dp) carry the same bytes per device, each sequence-parallel
    slice 1/t of the gathered activation; the weight parts gather (Redistribute) what they read."""
    spec = parse_model_string(LLAMA)
    got = {}
    for d in (1, 2):
        block = sharded_layers(build_from(spec, d, DType.bf16), d, 2, recompute, split_w=True, sp=True)[1]
        got[d] = sorted(_carried(block))
        assert block.bwd_w is not None
        assert any(op.name == "Redistribute" for op in block.bwd_w.ops())
    assert got[1] == got[2]
    if recompute == "full":  # nothing saved gathered: every carried activation is a slice
        assert not any(whole for _, whole in got[1])
