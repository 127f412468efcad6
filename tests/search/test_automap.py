"""Automap: search of the placements along one mesh axis (``distir.search.automap``)."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace

import pytest

import distir
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir import parse_module
from distir.ir.dtensor import Mesh, Replicate, Shard
from distir.ir.function import Module
from distir.parallel.distribute import distribute
from distir.parallel.strategy import parse_strategy
from distir.search.automap import Budget, automap, with_layout
from distir.search.automap.layout import Collective, layout_program, simulated
from distir.search.automap.model import HandComparison, automap_model
from distir.search.automap.points import Problem

os.environ.setdefault("OMP_NUM_THREADS", "1")
CLUSTER = parse_cluster("dgx2-v100")


def mlp(b: int, h: int) -> Module:
    """A two-layer MLP program (no placements declared anywhere)."""
    params = f"%x: Tensor[f32, ({b}, {h}), d0], %w1: Tensor[f32, ({h}, {4 * h}), d0], "
    params += f"%w2: Tensor[f32, ({4 * h}, {h}), d0]"
    return distir.check(
        parse_module(f"""func @mlp({params}) {{
  %h = MatMul(%x, %w1)
  %a = Gelu(%h)
  %y = MatMul(%a, %w2)
  return %y
}}
""")
    )


def test_large_mlp_finds_megatron_one_allreduce() -> None:
    # compute dominates: column- then row-parallel, one AllReduce of the (b, h) result
    b, h = 4096, 4096
    r = automap(
        mlp(b, h), Mesh.parse("tp=4"), "tp", CLUSTER, {"x": (Replicate(),)}, budget=Budget(50), seed=1
    )
    assert r.placements["w1"] == (Shard(1),)
    assert r.placements["w2"] == (Shard(0),)
    assert r.collectives == {"results": Counter({Collective("tp", "AllReduce", b * h * 4): 1})}


def test_tiny_mlp_replication_is_the_answer() -> None:
    # a few hundred FLOPs: any collective costs more than the work it would split
    m = mlp(8, 16)
    r = automap(m, Mesh.parse("tp=4"), "tp", CLUSTER, {"x": (Replicate(),)}, budget=Budget(50), seed=0)
    assert r.placements["w1"] == (Replicate(),) and r.placements["w2"] == (Replicate(),)
    assert not r.collectives
    megatron = layout_program(
        r.problem.fn, r.problem.mesh, {}, {0: (Replicate(),), 1: (Shard(1),), 2: (Shard(0),)}, {}
    )
    assert r.simulated.step_time_s < simulated(megatron, CLUSTER).step_time_s


def test_same_seed_same_search() -> None:
    m = build_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128", batch=8)
    mesh = Mesh.parse("dp=2,tp=4")
    runs = [
        automap_model(m, mesh, "tp", CLUSTER, batch_axis="dp", budget=Budget(10), seed=3) for _ in range(2)
    ]
    assert runs[0].decisions == runs[1].decisions
    assert runs[0].placements == runs[1].placements
    assert (runs[0].episodes, runs[0].found_episode) == (runs[1].episodes, runs[1].found_episode)


def test_budget_is_honoured() -> None:
    m = build_model("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128", batch=8)
    mesh = Mesh.parse("dp=2,tp=4")
    r = automap_model(m, mesh, "tp", CLUSTER, batch_axis="dp", budget=Budget(episodes=4), seed=0)
    assert r.episodes <= 4
    r = automap_model(
        m, mesh, "tp", CLUSTER, batch_axis="dp", budget=Budget(episodes=None, seconds=0.0), seed=0
    )
    assert r.episodes == 0


def test_grouping_shares_decisions_of_repeated_layers() -> None:
    m = build_model("gpt:layers=3,hidden=64,heads=4,seq=16,vocab=128", batch=8)
    from distir.search.automap.model import training_program

    grouped = Problem.build(training_program(m), Mesh.parse("tp=4"), "tp", {})
    alone = Problem.build(training_program(m), Mesh.parse("tp=4"), "tp", {}, group=False)
    wq = next(p for p in grouped.points if p.label == "@block_fwd:wq")
    assert [grouped.fn.params[i].name for i in wq.params] == ["wq_0", "wq_1", "wq_2"]
    labels = {p.label for p in alone.points}
    assert {"wq_0", "wq_1", "wq_2"} <= labels and "@block_fwd:wq" not in labels
    assert all(len(p.params) == 1 for p in alone.points)
    assert len(alone.points) > len(grouped.points)


@pytest.mark.slow
def test_llama_found_layout_at_least_as_fast_as_hand() -> None:
    m = build_model("llama:layers=2,hidden=256,heads=8,kv_heads=4,ffn=704,vocab=512,seq=64", batch=8)
    r = automap_model(m, Mesh.parse("dp=2,tp=4"), "tp", CLUSTER, batch_axis="dp", budget=Budget(60), seed=0)
    hand = HandComparison(r, m, CLUSTER)
    assert hand.step_time_s is not None
    assert r.simulated.step_time_s <= hand.step_time_s * 1.0001


def test_found_layout_plugs_into_distribute() -> None:
    declared = build_model("gpt:layers=2,hidden=1024,heads=16,seq=512,vocab=8192", batch=16)
    bare = replace(declared, weights=tuple(replace(w, tp=Replicate()) for w in declared.weights))
    r = automap_model(
        bare, Mesh.parse("dp=2,tp=4"), "tp", CLUSTER, batch_axis="dp", budget=Budget(12), seed=0
    )
    found = with_layout(bare, r)
    assert [w.tp for w in found.weights] == [r.placements[w.name][1] for w in bare.weights]
    assert any(isinstance(w.tp, Shard) for w in found.weights)
    assert distir.check(distribute(found, parse_strategy("d2.t4.p1.k1")))


@pytest.mark.slow
def test_deep_gpt_recovers_megatron_blocks() -> None:
    # the bench's question at 4 blocks (searched on the two-block form, extrapolated): every
    # block has the hand layout's collectives, and the step is at least as fast as the hand one
    m = build_model("gpt:layers=4,hidden=1024,heads=16,seq=512,vocab=8192", batch=16)
    r = automap_model(m, Mesh.parse("dp=2,tp=4"), "tp", CLUSTER, batch_axis="dp", budget=Budget(40), seed=0)
    hand = HandComparison(r, m, CLUSTER)
    assert hand.blocks_match
    assert hand.step_time_s is not None and r.simulated.step_time_s <= hand.step_time_s * 1.0001
    for i in range(4):
        assert r.placements[f"w1_{i}"][1] == Shard(1) and r.placements[f"w2_{i}"][1] == Shard(0)
        assert r.placements[f"wq_{i}"][1] == Shard(1) and r.placements[f"wo_{i}"][1] == Shard(0)
    # the gain is the data-parallel baseline's step over the found one's; at this size (1024
    # hidden on one 16-V100 NVSwitch node) the baseline's bucketed all-reduces, one call per
    # bucket, make data parallelism alone about as fast as dp2×tp4, so no side is asserted
    assert r.baseline is not None
    assert r.gain == pytest.approx(r.baseline.step_time_s / r.simulated.step_time_s, rel=1e-12)


@pytest.mark.slow
def test_cli_auto_json(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from distir.cli import app

    app(
        [
            "shard",
            "--model",
            "gpt:layers=1,hidden=64,heads=4,seq=16,vocab=128",
            "--mesh",
            "dp=2,tp=4",
            "--auto",
            "tp",
            "--episodes",
            "10",
            "--seed",
            "2",
            "--json",
        ],
        standalone_mode=False,
    )
    got = json.loads(capsys.readouterr().out)
    for key in ("decisions", "collectives", "seconds", "episodes", "step_time_s", "matches_hand_layout"):
        assert key in got
    for key in ("matches_hand_blocks", "differing_layers"):
        assert key in got
    assert got["episodes"] <= 10
    assert got["decisions"]["ids"].startswith("S(0)")


def test_cli_auto_on_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from distir.cli import app
    from distir.ir.printer import print_module

    f = tmp_path / "mlp.distir"
    f.write_text(print_module(mlp(512, 512)))
    app(
        ["shard", str(f), "--mesh", "tp=4", "--auto", "tp", "--annotate", "x=R", "--episodes", "20"],
        standalone_mode=False,
    )
    out = capsys.readouterr().out
    assert "%w1:" in out and "simulated step time" in out


def test_cli_auto_unknown_axis_is_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    import sys

    from distir.cli import main

    argv = sys.argv
    sys.argv = [
        "distir",
        "shard",
        "--model",
        "gpt:layers=1,hidden=64,heads=4,seq=16,vocab=128",
        "--mesh",
        "dp=2,tp=4",
        "--auto",
        "pp",
    ]
    try:
        with pytest.raises(SystemExit) as e:
            main()
    finally:
        sys.argv = argv
    assert e.value.code == 2
    assert "no axis pp" in capsys.readouterr().err


@pytest.mark.slow
def test_simulate_tp_layout_auto(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a found layout plugs in where the declared one does: at least as fast (the search's judge
    # is this very simulation, and the declared layout is one of the layouts it can reach)
    from distir.cli import app
    from distir.search.automap import command

    monkeypatch.setattr(command, "AUTO_EPISODES", 40)
    monkeypatch.setattr(command, "AUTO_SECONDS", 1e9)  # 40 episodes however loaded the machine is

    times = {}
    for how in ("declared", "auto"):
        args = ["simulate", "--model", "gpt:layers=2,hidden=1024,heads=16,seq=512,vocab=8192"]
        args += ["--strategy", "d2.t4.p1.k1", "--batch", "16", "--tp-layout", how, "--json"]
        app(args, standalone_mode=False)
        times[how] = json.loads(capsys.readouterr().out)["step_time_s"]
    assert times["auto"] <= times["declared"] * 1.0001


def test_program_without_placements_beats_data_parallelism() -> None:
    # a program nobody wrote placements for, batch split over dp: the found layout is at least
    # as fast as the same 8 devices all data parallel, and holds no more memory
    m = mlp(256, 4096)
    r = automap(
        m,
        Mesh.parse("dp=2,tp=4"),
        "tp",
        CLUSTER,
        {"x": (Shard(0), None)},
        budget=Budget(30),
        seed=0,
        batch_axis="dp",
    )
    assert r.baseline is not None and r.baseline_label == "data parallel over 8 devices"
    assert r.simulated.step_time_s <= r.baseline.step_time_s
    assert r.simulated.peak_memory <= r.baseline.peak_memory
    assert r.placements["w1"][1] == Shard(1) and r.placements["w2"][1] == Shard(0)


def test_tiny_gpt_replication_is_the_answer() -> None:
    # tiny weights and microsecond kernels: every collective costs more than the work it would
    # split, so no weight is sharded, and the step beats the hand (Megatron) layout's
    m = build_model("gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32", batch=16)
    r = automap_model(m, Mesh.parse("dp=2,tp=4"), "tp", CLUSTER, batch_axis="dp", budget=Budget(20), seed=0)
    assert all(r.placements[w.name][1] == Replicate() for w in m.weights)
    blocks = ("@block[1]", "@block[2]")
    assert not any(c.axis == "tp" for layer in blocks for c in r.collectives.get(layer, ()))
    hand = HandComparison(r, m, CLUSTER)
    assert hand.step_time_s is not None and r.simulated.step_time_s < hand.step_time_s


def test_budget_spent_by_episodes_or_seconds() -> None:
    assert Budget(3, None).spent(3, 1e9) and not Budget(3, None).spent(2, 1e9)
    assert Budget(None, 1.0).spent(0, 1.0) and not Budget(None, 1.0).spent(10**9, 0.5)
    assert Budget(3, 1.0).spent(3, 0.0) and Budget(3, 1.0).spent(0, 2.0)


IMPORTED = "tests.search.automap_models:wide_mlp"  # no weight name the importer knows


def test_imported_model_without_placements_beats_data_parallelism() -> None:
    # a layer type nobody wrote placements for: the found layout is faster than the same 8 GPUs
    # all data parallel, in no more memory — Megatron's column/row pair in each block
    pytest.importorskip("torch")
    m = build_model(IMPORTED, batch=64)
    assert all(w.tp == Replicate() for w in m.weights)
    r = automap_model(m, Mesh.parse("dp=2,tp=4"), "tp", CLUSTER, batch_axis="dp", budget=Budget(30), seed=0)
    assert r.baseline is not None and r.baseline_label == "data parallel over 8 devices"
    assert r.simulated.step_time_s < r.baseline.step_time_s
    assert r.simulated.peak_memory <= r.baseline.peak_memory
    for i in range(2):
        assert r.placements[f"blocks.{i}.widen.weight"][1] == Shard(1)
        assert r.placements[f"blocks.{i}.narrow.weight"][1] == Shard(0)


@pytest.mark.slow
def test_search_tp_layout_auto_on_model_without_placements(capsys) -> None:  # type: ignore[no-untyped-def]
    # distir search --tp-layout auto: a model that declares no tensor-parallel placements is
    # searched at t > 1 with the layout found; with its declared (absent) one, t > 1 would only
    # replicate the model, so --tp 4 is refused
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from distir.cli import app

    args = ["search", "--model", IMPORTED, "--cluster", "dgx2-v100", "--batch", "64", "--tp", "4"]
    args += ["--pp", "1", "--top", "1", "--workers", "1", "--fresh", "--json"]
    refused = CliRunner().invoke(app, [*args, "--tp-layout", "declared"])
    assert refused.exit_code == 2 and "no weight of the model is tensor-parallel" in refused.output
    app([*args, "--tp-layout", "auto"], standalone_mode=False)
    got = json.loads(capsys.readouterr().out)
    assert got["results"][0]["t"] == 4


def test_search_request_auto_layout_is_its_own_search() -> None:
    from distir.search.run import SearchRequest, resolve_layout

    req = SearchRequest(model="mlp:layers=2,hidden=1024", cluster="dgx2-v100:1", batch=32, tp_layout="auto")
    found = resolve_layout(req)
    names = [w.name for w in build_model("mlp:layers=2,hidden=1024", 1).weights]
    assert [n for n, _ in found.tp_found] == names
    assert any(isinstance(p, Shard) for _, p in found.tp_found)
    assert found.key_parts() != SearchRequest(model=req.model, cluster=req.cluster, batch=32).key_parts()
    assert [w.tp for w in found.spec().build(8).weights] == [p for _, p in found.tp_found]


def test_no_collective_along_an_axis_of_one_device() -> None:
    """``shard --auto tp --mesh tp=2`` judges on a (dp=1, tp=2) mesh: a placement change along
    the one-device dp axis moves nothing and is no collective (it was listed as AllGather(dp))."""
    from distir.ir.dtensor import DTensorType, Mesh, Replicate, Shard
    from distir.ir.types import Device, DType
    from distir.search.automap.layout import redistribution_collectives

    mesh = Mesh((("dp", 1), ("tp", 2)), (Device(0), Device(1)))
    t = DTensorType(DType.f32, (4, 8), mesh, (Shard(0), Shard(1)))
    got = redistribution_collectives(t, (Replicate(), Replicate()))
    assert [(c.axis, c.kind) for c in got] == [("tp", "AllGather")]
    assert got[0].nbytes == 4 * 8 * 4
