"""Review of batch shares (uneven data parallelism): weighted mesh axes (``dp=2[3:1]``) in the
text format, strategies with ``.b…`` under every schedule and option, their numerics, the CLI, the
simulator, and the sharding rules that must not treat a weighted axis as an even one.

Real bugs are kept as ``xfail(strict=True)`` reproducers; everything else is a passing test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import distir
from distir.autodiff.train import Optimizer
from distir.cli import app
from distir.frontends.zoo.registry import build_model
from distir.hardware.cluster import parse_cluster
from distir.interp.lockstep import check_deadlock_free
from distir.interp.loop import InterpretError
from distir.interp.project import project
from distir.interp.reference import run_reference
from distir.ir import parse_module, print_module
from distir.ir.dtensor import AxisSize, DTensorType, Mesh, shares_of
from distir.ir.function import Module
from distir.ir.parser import ParseError
from distir.ir.types import DType, IRTypeError
from distir.ir.verify import verify
from distir.ops.dist import parse_mesh_attr
from distir.parallel.check import check_against_sequential
from distir.parallel.distribute import device_map, distribute
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.materialize import local_shape, materialize, shard_value
from distir.parallel.sharding.propagate import ShardingError, propagate
from distir.parallel.sharding.sink_reductions import sink_reductions
from distir.parallel.strategy import Strategy, StrategyError, parse_strategy
from distir.sim.cost import RooflineCostModel
from distir.sim.simulate import SimResult, simulate

FAMILIES = {
    "mlp": "mlp:layers=4,hidden=6",
    "gpt": "gpt:layers=4,hidden=8,heads=2,seq=4,vocab=16",
    "llama": "llama:layers=4,hidden=8,heads=4,kv_heads=2,ffn=12,vocab=16,seq=4",
}
GPT_CLI = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=512"
MIXED = "p3.8xlarge:1+g4dn.12xlarge:1"
BATCH48 = ["--batch", "48", "--json"]
runner = CliRunner()


def _weighted_fn(dst_mesh: str) -> str:
    return (
        "func @f(%x: DTensor[f32, (12, 6), mesh(dp=2[3:1]; d0, d1), [S(0)]]) {\n"
        f'  %y = MeshSend(%x, mesh="{dst_mesh}")\n'
        "  return %y\n"
        "}\n"
    )


# -- text format -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("strategy", "kw"),
    [
        ("d2.t2.p2.k2.1f1b.b3-1", {}),
        ("d2.t2.p2.k2.interleaved.v2.b3-1", {"comm_streams": True}),
        ("d2.t1.p2.k2.gpipe.b3-1", {"train": False}),
        ("d2.t2.sp.p2.k2.zb1.rfull.b1-3", {"comm_streams": True}),
    ],
)
def test_pipelined_share_program_round_trips_with_weighted_meshsend(
    strategy: str, kw: dict[str, bool]
) -> None:
    s = parse_strategy(strategy)
    assert s.shares is not None
    train, streams = kw.get("train", True), kw.get("comm_streams", False)
    prog = distribute(build_model(FAMILIES["gpt"], batch=8), s, Optimizer("adam"), train, streams)
    text = print_module(prog)
    again = parse_module(text)
    assert print_module(again) == text
    verify(again)
    want = f"dp=2[{':'.join(map(str, s.shares))}]"
    sends = re.findall(r'MeshSend\(%\w+, mesh="([^"]+)"\)', text)
    assert sends and all(m.startswith(want) for m in sends), sends[:3]
    # the attribute parses to the weighted stage mesh
    mesh = parse_mesh_attr(sends[0])
    assert shares_of(mesh.shape[0]) == s.shares and shares_of(mesh.shape[1]) is None
    # the reparsed program simulates exactly as the built one
    dm = device_map(s, streams)
    cl = parse_cluster(MIXED)
    assert simulate(again, cl, dm, batch=8).step_time_s == simulate(prog, cl, dm, batch=8).step_time_s


@pytest.mark.parametrize(
    ("shares", "col", "msg"),
    [
        ("[2:0]", 43, "needs 2 positive integer shares"),
        ("[2:1:1]", 43, "needs 2 positive integer shares"),
        ("[0:0]", 43, "needs 2 positive integer shares"),
        ("[]", 45, "expected a share of mesh axis dp"),
        ("[2,1]", 46, "expected ']' to close the shares of mesh axis dp"),
        ("[2:-1]", 47, "expected a share of mesh axis dp"),
        ("[2:x]", 47, "expected a share of mesh axis dp"),
        ("[2:1", 48, "expected ']' to close the shares"),
        ("[2:1][1:2]", 49, "expected ';' between the mesh axes"),
    ],
)
def test_malformed_shares_are_parse_errors_with_position(shares: str, col: int, msg: str) -> None:
    text = (
        f"func @f(%x: DTensor[f32, (12, 4), mesh(dp=2{shares}, tp=2; d0, d1, d2, d3), [S(0), R]]) {{\n"
        "  %y = Relu(%x)\n  return %y\n}\n"
    )
    with pytest.raises(ParseError) as e:
        parse_module(text)
    assert f":1:{col}:" in str(e.value) and msg in str(e.value), str(e.value)


@pytest.mark.parametrize("bad", ["dp=2[2,1]", "dp=2[2:0]", "dp=2[]", "dp=2[2:1", "dp=2[2:1:]", "dp=x[2:1]"])
def test_malformed_shares_in_mesh_text_are_type_errors(bad: str) -> None:
    """``Mesh.parse`` (the CLI's ``--mesh``, MeshSend's attribute) refuses them with IRTypeError."""
    with pytest.raises(IRTypeError, match=r"mesh axis|shares"):
        Mesh.parse(bad)
    with pytest.raises(IRTypeError, match="attribute mesh="):
        parse_mesh_attr(f"{bad}; d0, d1")


def test_noncanonical_shares_print_canonically() -> None:
    text = (
        "func @f(%x: DTensor[f32, (12, 4), mesh(dp=2{S}, tp=2; d0, d1, d2, d3), [S(0), R]]) {{\n"
        "  %y = Relu(%x)\n  return %y\n}}\n"
    )
    assert "mesh(dp=2[2:1], tp=2;" in print_module(parse_module(text.format(S="[4:2]")))
    assert "mesh(dp=2, tp=2;" in print_module(parse_module(text.format(S="[3:3]")))
    m = parse_module(text.format(S="[3:3]"))
    x = m.entry.params[0].type
    assert isinstance(x, DTensorType) and type(x.mesh.shape[0]) is int
    # a MeshSend attribute in non-lowest terms names the same weighted mesh
    typed = distir.check(parse_module(_weighted_fn("dp=2[6:2]; d2, d3")))
    assert 'mesh="dp=2[6:2]; d2, d3"' in print_module(typed)
    y = typed.entry.params[0].type
    assert isinstance(y, DTensorType) and y.mesh.shape[0] == AxisSize(2, (3, 1))


@pytest.mark.parametrize("dst", ["dp=2; d2, d3", "dp=2[1:3]; d2, d3"])
def test_meshsend_to_a_differently_weighted_mesh_is_refused(dst: str) -> None:
    with pytest.raises(ValueError, match=r"same shape.*expected dp=2\[3:1\]"):
        distir.check(parse_module(_weighted_fn(dst)))


def test_cli_show_and_lower_a_share_program(tmp_path: Path) -> None:
    s = parse_strategy("d2.t1.p2.k2.1f1b.b3-1")
    f = tmp_path / "p.distir"
    f.write_text(print_module(distribute(build_model(FAMILIES["mlp"], batch=8), s)))
    r = runner.invoke(app, ["show", str(f)])
    assert r.exit_code == 0 and "mesh(dp=2[3:1], tp=1; d2, d3)" in r.stdout
    shown = tmp_path / "shown.distir"
    shown.write_text(r.stdout)
    assert runner.invoke(app, ["show", str(shown)]).stdout == r.stdout  # idempotent
    r = runner.invoke(app, ["lower", str(f), "--all", "--json"])
    data = json.loads(r.stdout)
    assert r.exit_code == 0 and data["deadlock_free"] is True
    # microbatch of 4 in shares 3-1: replica 0 gets 3 rows, replica 1 one
    assert "Tensor[f32, (3, 6), d0]" in data["ranks"]["d0"]
    assert "Tensor[f32, (1, 6), d1]" in data["ranks"]["d1"]


# -- strategies: numerics ------------------------------------------------------------------------
NUMERIC = [
    ("mlp", "d2.t1.p2.k2.gpipe.b3-1", 8),
    ("mlp", "d2.t2.p2.k2.zb1.b1-3", 8),
    ("mlp", "d2.t1.p2.k2.1f1b.b3-1.@3-2-1-0", 8),  # placement
    ("mlp", "d3.t1.p2.k1.gpipe.L3-1.b1-1-5", 7),  # uneven partition, odd batch
    ("gpt", "d2.t2.p2.k2.interleaved.v2.b3-1", 8),
    ("gpt", "d2.t2.sp.p2.k2.1f1b.rsel.b2-1", 6),
    ("gpt", "d2.t1.p1.k1.1f1b.b7-1", 8),  # one replica gets a single sample
    ("gpt", "d2.t1.p1.k2.1f1b.b2-1", 6),  # microbatch of exactly Σshares
    ("gpt", "d2.t4.p1.k1.1f1b.b1-2", 3),  # t > 1, tp unweighted
    ("gpt", "d4.t1.p1.k1.1f1b.b1-2-3-4", 10),
    ("llama", "d2.t2.p1.k2.1f1b.b2-1", 6),
]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "strategy", "batch"), NUMERIC)
def test_share_strategy_trains_as_the_sequential_step(family: str, strategy: str, batch: int) -> None:
    s = parse_strategy(strategy)
    assert s.shares is not None and str(s) == strategy
    cmp = check_against_sequential(build_model(FAMILIES[family], batch=batch, dtype=DType.f64), s)
    assert cmp.max_rel_diff < 1e-7, f"{s}: {cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    check_deadlock_free(project(cmp.materialized))
    x = cmp.distributed.entry.params[0].type
    assert isinstance(x, DTensorType)
    mb = batch // s.k
    rows = [local_shape(x, x.mesh.devices[r * s.t])[0] for r in range(s.d)]
    assert rows == [mb * w // sum(s.shares) for w in s.shares]


def test_shares_with_adam_train_as_the_sequential_step() -> None:
    s = parse_strategy("d3.t1.p2.k2.1f1b.b1-2-5")
    cmp = check_against_sequential(
        build_model(FAMILIES["gpt"], batch=16, dtype=DType.f64), s, Optimizer("adam")
    )
    assert cmp.max_rel_diff < 1e-7, (cmp.worst, cmp.max_rel_diff)


def test_shares_with_mixed_precision_match_the_even_strategy() -> None:
    model = build_model(FAMILIES["gpt"], batch=8, dtype=DType.bf16)
    errs = {}
    for text in ["d2.t2.p2.k2.1f1b", "d2.t2.p2.k2.1f1b.b3-1"]:
        cmp = check_against_sequential(model, parse_strategy(text), precision="mixed")
        errs[text] = cmp.update_error()[0]
        assert "[3:1]" in print_module(cmp.distributed) or ".b" not in text
    assert errs["d2.t2.p2.k2.1f1b.b3-1"] < 1e-3, errs


def test_inference_with_shares_materializes_and_splits_unevenly() -> None:
    s = parse_strategy("d2.t2.p2.k2.1f1b.b1-3")
    prog = distribute(build_model(FAMILIES["gpt"], batch=8), s, train=False)
    verify(prog)
    from distir.interp.annotate import annotate_types
    from distir.ir.rewrite import inline_calls

    mat = materialize(annotate_types(Module((inline_calls(prog),))))
    check_deadlock_free(project(mat))
    x = prog.entry.params[0].type
    assert isinstance(x, DTensorType)
    assert [local_shape(x, x.mesh.devices[r * s.t])[0] for r in range(2)] == [1, 3]


# -- strategies: errors --------------------------------------------------------------------------
def test_share_strategy_errors_are_typed_and_named() -> None:
    with pytest.raises(StrategyError, match="do not combine with ZeRO"):
        Strategy(d=2, zero=2, shares=(2, 1))
    with pytest.raises(StrategyError, match=r"strategy 'd2.t1.p1.k1.1f1b.z3.b2-1'.*ZeRO"):
        parse_strategy("d2.t1.p1.k1.1f1b.z3.b2-1")
    with pytest.raises(StrategyError, match="d = 2 positive integers"):
        parse_strategy("d2.b0-1")
    with pytest.raises(StrategyError, match="d = 2 positive integers"):
        Strategy(d=2, shares=[2, 1])  # type: ignore[arg-type]
    with pytest.raises(StrategyError, match="unknown part 'b'"):
        parse_strategy("d2.b")
    # d = 1: any one share is the even split
    assert Strategy(d=1, shares=(5,)) == Strategy(d=1) and str(parse_strategy("d1.b5")) == "d1.t1.p1.k1.1f1b"
    # a microbatch smaller than Σshares
    with pytest.raises(
        StrategyError, match=r"does not split into k=2 microbatches of whole samples in the batch shares 7-1"
    ):
        distribute(build_model(FAMILIES["mlp"], batch=8), parse_strategy("d2.k2.b7-1"))


def test_materialize_refuses_scatter_along_a_weighted_axis() -> None:
    for frm, to in [("P(sum)", "S(0)"), ("S(0)", "S(1)")]:
        src = (
            f"func @f(%x: DTensor[f32, (12, 6), mesh(dp=2[2:1]; d0, d1), [{frm}]]) {{\n"
            f'  %y = Redistribute(%x, to="{to}")\n  return %y\n}}\n'
        )
        with pytest.raises(
            ShardingError, match=rf"{re.escape(frm)} -> {re.escape(to)} along mesh axis dp with uneven"
        ):
            materialize(distir.check(parse_module(src)))
    # R -> S is a local slice: allowed, and the pieces follow the shares
    src = (
        "func @f(%x: DTensor[f32, (12, 6), mesh(dp=2[2:1]; d0, d1), [R]]) {\n"
        '  %y = Redistribute(%x, to="S(0)")\n  return %y\n}\n'
    )
    mat = materialize(distir.check(parse_module(src)))
    x = np.arange(72, dtype=np.float32).reshape(12, 6)
    outs = run_reference(mat, [x, x])
    assert [o.shape for o in outs] == [(8, 6), (4, 6)]
    assert np.array_equal(np.concatenate(outs), x)


# -- simulator -------------------------------------------------------------------------------------
def _sim(text: str, cluster: str, model: str = FAMILIES["gpt"], batch: int = 8) -> tuple[SimResult, str]:
    s = parse_strategy(text)
    prog = distribute(build_model(model, batch), s, Optimizer("adam"), comm_streams=True)
    return simulate(prog, parse_cluster(cluster), device_map(s, True), batch=batch), print_module(prog)


def test_larger_share_holds_more_and_uneven_is_slower_on_alike_gpus() -> None:
    model = "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64"
    even, _ = _sim("d2.t1.p1.k1.1f1b", "p3.8xlarge:1", model, 32)
    r, _ = _sim("d2.t1.p1.k1.1f1b.b3-1", "p3.8xlarge:1", model, 32)
    assert r.peak_memory[0] > even.peak_memory[0] == even.peak_memory[1] > r.peak_memory[1]
    assert r.step_time_s > even.step_time_s  # alike GPUs: the 3-share replica sets the pace
    mirrored, _ = _sim("d2.t1.p1.k1.1f1b.b1-3", "p3.8xlarge:1", model, 32)
    assert mirrored.peak_memory[1] == r.peak_memory[0] and mirrored.peak_memory[0] == r.peak_memory[1]
    assert mirrored.step_time_s == r.step_time_s


def _dtensor_and_materialized(text: str) -> tuple[SimResult, SimResult]:
    from distir.interp.annotate import annotate_types
    from distir.ir.rewrite import inline_calls

    s = parse_strategy(text)
    prog = distribute(
        build_model("gpt:layers=2,hidden=256,heads=4,seq=128,vocab=512", 32), s, Optimizer("adam")
    )
    mat = materialize(annotate_types(Module((inline_calls(prog),))))
    cl = parse_cluster("p3.8xlarge:1")
    # the calls are inlined before materializing, and fused chains do not cross calls
    # (distir.sim.fusion): compare op for op, unfused
    cm = RooflineCostModel(cl, fuse=False)
    return (
        simulate(prog, cl, device_map(s), cm, batch=32),
        simulate(mat, cl, device_map(s), cm, batch=32),
    )


def test_even_dtensor_simulation_matches_its_materialized_form() -> None:
    """Control for the xfail below: with even shards both simulations agree on busy time."""
    a, b = _dtensor_and_materialized("d2.t1.p1.k1.1f1b")
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)
    assert a.busy_s == pytest.approx(b.busy_s, rel=1e-9)


@pytest.mark.xfail(
    strict=True,
    reason="sim/spmd.py _local_shape charges every device of a mesh the slowest piece's time "
    "(`seconds = max(seconds, got[0])`), so with shares 3-1 the 1-share replica is reported as busy "
    "as the 3-share one (5376 us each, bubble 0); its materialized form says 2558 us, bubble 0.24. "
    "Step time agrees; busy_s / bubble_fraction (distir simulate, search's bubble column) do not",
)
def test_dtensor_simulation_busy_time_follows_the_shares() -> None:
    a, b = _dtensor_and_materialized("d2.t1.p1.k1.1f1b.b3-1")
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)  # holds
    assert b.busy_s[0] > 1.5 * b.busy_s[1]  # the materialized program: the shares show
    assert a.busy_s == pytest.approx(b.busy_s, rel=1e-6)
    assert a.bubble_fraction == pytest.approx(b.bubble_fraction, abs=1e-6)


def test_equal_shares_simulate_bit_identically_to_even() -> None:
    assert parse_strategy("d2.t2.p2.k2.1f1b.b1-1") == parse_strategy("d2.t2.p2.k2.1f1b")
    a, ta = _sim("d2.t2.p2.k2.1f1b.b1-1", MIXED)
    b, tb = _sim("d2.t2.p2.k2.1f1b.b4-4", MIXED)
    c, tc = _sim("d2.t2.p2.k2.1f1b", MIXED)
    assert ta == tb == tc and "[" not in re.findall(r"mesh\(dp=\S+", tc)[0]
    for x in (a, b):
        assert x.step_time_s == c.step_time_s and x.peak_memory == c.peak_memory and x.busy_s == c.busy_s


# -- CLI ---------------------------------------------------------------------------------------------
def test_cli_simulate_share_strategy_json() -> None:
    r = runner.invoke(
        app,
        ["simulate", "--model", GPT_CLI, "--strategy", "d2.t4.p1.k2.1f1b.b2-1", "--cluster", MIXED, *BATCH48],
    )
    assert r.exit_code == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["strategy"] == "d2.t4.p1.k2.1f1b.b2-1" and data["step_time_s"] > 0
    peaks = data["peak_memory_bytes"]
    assert peaks["d0"] > peaks["d4"]  # the V100 replica takes 2 of 3 shares
    r = runner.invoke(
        app,
        ["simulate", "--model", GPT_CLI, "--strategy", "d2.t4.p1.k2.1f1b.b4-1", "--cluster", MIXED, *BATCH48],
    )
    assert r.exit_code == 2 and "batch shares 4-1" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_search_finds_shares_and_rerenders_from_store(tmp_path: Path) -> None:
    args = ["search", "--model", GPT_CLI, "--cluster", MIXED, "--batch", "48", "--pp", "1", "--json"]
    args += ["--store", str(tmp_path / "s.sqlite"), "--workers", "1"]
    r1 = runner.invoke(app, [*args, "--csv", str(tmp_path / "a.csv")])
    assert r1.exit_code == 0, r1.stdout + r1.stderr
    first = json.loads(r1.stdout)
    assert first["from_store"] is False
    win = first["results"][0]["strategy"]
    assert ".b" in win and parse_strategy(win).shares is not None
    r2 = runner.invoke(app, [*args, "--csv", str(tmp_path / "b.csv")])
    second = json.loads(r2.stdout)
    assert r2.exit_code == 0 and second["from_store"] is True
    assert second["results"] == first["results"]
    csv = (tmp_path / "a.csv").read_text()
    assert f",{win}," in csv and csv == (tmp_path / "b.csv").read_text()


# -- bugs --------------------------------------------------------------------------------------------
def _run_sharded(
    src: str, mesh: str, notes: dict[str, str], args: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(sequential result, distributed result) of ``src`` sharded on ``mesh`` with ``notes``."""
    m = distir.check(parse_module(src))
    prop = propagate(m, Mesh.parse(mesh), notes)
    leg = distir.check(sink_reductions(distir.check(legalize(prop.module))))
    mat = distir.check(materialize(leg))
    flat: list[np.ndarray] = []
    for p, v in zip(leg.entry.params, args, strict=True):
        assert isinstance(p.type, DTensorType)
        pieces = shard_value(v, p.type)
        flat.extend(pieces[d] for d in p.type.mesh.devices)
    return np.asarray(run_reference(m, args)[0]), np.asarray(run_reference(mat, flat)[0])


REDUCE_MEAN = (
    "func @f(%x: Tensor[f64, (8, 4), d0]) {\n  %y = ReduceMean(%x, axes=[0], keepdims=0)\n  return %y\n}\n"
)
MSE_MEAN = (
    "func @f(%x: Tensor[f64, (8, 4), d0], %t: Tensor[f64, (8, 4), d0]) {\n"
    '  %y = MSELoss(%x, %t, reduction="mean")\n  return %y\n}\n'
)


def test_mean_over_an_even_axis_is_right() -> None:
    """Control for the two tests below (once bugs: a weighted axis was taken as even): on an even
    dp axis the pending mean is right."""
    x = (np.arange(32, dtype=np.float64).reshape(8, 4)) ** 2
    want, got = _run_sharded(REDUCE_MEAN, "dp=2", {"x": "S(0)"}, [x])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    t = np.zeros((8, 4))
    t[:2] = 5.0
    want, got = _run_sharded(MSE_MEAN, "dp=2", {"x": "S(0)", "t": "S(0)"}, [x, t])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_reduce_mean_over_a_weighted_axis_is_the_global_mean() -> None:
    x = (np.arange(32, dtype=np.float64).reshape(8, 4)) ** 2
    want, got = _run_sharded(REDUCE_MEAN, "dp=2[3:1]", {"x": "S(0)"}, [x])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_mean_loss_over_a_weighted_axis_is_the_global_mean() -> None:
    x = (np.arange(32, dtype=np.float64).reshape(8, 4)) ** 2
    t = np.zeros((8, 4))
    t[:2] = 5.0
    want, got = _run_sharded(MSE_MEAN, "dp=2[3:1]", {"x": "S(0)", "t": "S(0)"}, [x, t])
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_simulator_refuses_what_materialize_refuses() -> None:
    src = (
        "func @f(%x: DTensor[f32, (12, 6), mesh(dp=2[2:1]; d0, d1), [P(sum)]]) {\n"
        '  %y = Redistribute(%x, to="S(0)")\n  return %y\n}\n'
    )
    m = distir.check(parse_module(src))
    with pytest.raises(ShardingError):
        materialize(m)
    with pytest.raises(InterpretError, match="P\\(sum\\) -> S\\(0\\) along mesh axis dp with uneven shares"):
        simulate(m, parse_cluster("p3.8xlarge:1"))
