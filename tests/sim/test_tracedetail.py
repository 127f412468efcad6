"""Detailed traces (``simulate(trace_detail=...)``, ``distir.sim.tracedetail``, the trace file of
``distir.sim.trace``): a hand-timed program with calls at each level; on a pipelined model, the
trace JSON loads, nested slices lie within their parent on the same track, every flow start has
its end, every slice has its arguments, and the leaf ops of each slot add up to the simulator's
own busy and communication time (which checks the bodies carried to another mesh land on the
right GPUs)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import distir
from distir.cli import app
from distir.frontends.zoo import build_model
from distir.hardware.cluster import parse_cluster
from distir.ir import parse_module
from distir.parallel.distribute import device_map, distribute
from distir.parallel.strategy import parse_strategy
from distir.sim.simulate import SimResult, simulate
from distir.sim.trace import write_trace
from sim.test_simulate import UnitCost, tiny_cluster  # tests/ is on sys.path

T = "Tensor[f32, (4, 2), d0]"
NESTED = f"""func @layer(%x) {{
  %h = Relu(%x)
  %s = Send(%h, dst=d1)
  %o = Relu(%s)
  return %o
}}

func @chunk(%x) {{
  %a = @layer(%x)
  %b = Relu(%a)
  return %b
}}

func @main(%x: {T}) {{
  %y = @chunk(%x)
  return %y
}}
"""


def nested(level: str) -> SimResult:
    m = distir.check(parse_module(NESTED))
    return simulate(m, tiny_cluster(), cost_model=UnitCost(), trace=True, trace_detail=level)


@pytest.mark.parametrize("level", ["chunk", "layer", "op"])
def test_levels_by_hand(level: str) -> None:
    # d0: Relu 0-1, Send 1-1.5 (d0 and d1); d1: Relu 1.5-2.5, then the chunk's Relu 2.5-3.5
    r = nested(level)
    assert r.step_time_s == 3.5
    got = sorted((s.depth, s.name, s.slot, s.start, s.end) for s in r.trace_detail().slices)
    want = [(0, "@chunk", 0, 0.0, 1.5), (0, "@chunk", 1, 1.0, 3.5)]
    if level != "chunk":
        want += [(1, "@layer", 0, 0.0, 1.5), (1, "@layer", 1, 1.0, 2.5), (1, "Relu", 1, 2.5, 3.5)]
    if level == "op":
        want += [
            (2, "Relu", 0, 0.0, 1.0),
            (2, "Relu", 1, 1.5, 2.5),
            (2, "Send", 0, 1.0, 1.5),
            (2, "Send", 1, 1.0, 1.5),
        ]
    assert got == sorted(want)
    flows = r.trace_detail().flows
    # the Send is inside the layer: its arrow shows once the trace looks inside
    assert [(f.src, f.dst, f.start, f.end) for f in flows] == ([(0, 1, 1.0, 1.5)] if level == "op" else [])


def test_op_slices_carry_types_flops_and_bytes() -> None:
    send = next(s for s in nested("op").trace_detail().slices if s.name == "Send")
    assert send.args["op"] == "Send" and send.comm
    assert send.args["inputs"] == ["Tensor[f32, (4, 2), d0]"] and send.args["outputs"] == [
        "Tensor[f32, (4, 2), d1]"
    ]
    assert send.args["message_bytes"] == 4 * 2 * 4 and send.args["result_bytes"] == 4 * 2 * 4
    call = next(s for s in nested("op").trace_detail().slices if s.name == "@chunk")
    assert call.args["function"] == "chunk" and call.args["ops"] == 4


def test_unknown_level_is_refused() -> None:
    m = distir.check(parse_module(NESTED))
    with pytest.raises(ValueError, match="trace detail must be one of chunk, layer, op"):
        simulate(m, tiny_cluster(), trace=True, trace_detail="kernel")


# --- a pipelined model -------------------------------------------------------------------------

CLUSTER = parse_cluster("dgx-a100")
STRATEGY = "d2.t2.p2.k2.1f1b"  # bodies carried to the second stage's mesh


def pipeline(level: str) -> SimResult:
    s = parse_strategy(STRATEGY)
    m = distribute(build_model("gpt:layers=4,hidden=256,heads=4", batch=8), s, comm_streams=True)
    return simulate(m, CLUSTER, device_map(s, True), trace=True, batch=8, trace_detail=level)


def load(r: SimResult, tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / "t.json"
    write_trace(r, out)
    events: list[dict[str, Any]] = json.loads(out.read_text())["traceEvents"]
    return events


def check_nesting(xs: list[dict[str, Any]]) -> int:
    """On each track, slices that take time are disjoint or nested (a stack); returns the deepest
    nesting. (A slice of no time is within whatever spans its instant.)"""
    eps = 1e-6  # microseconds: times are seconds * 1e6 in floating point
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in xs:
        if e["dur"] > eps:
            tracks[(e["pid"], e["tid"])].append(e)
    deepest = 0
    for evs in tracks.values():
        stack: list[float] = []  # ends of the open slices
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1] - eps:
                stack.pop()
            if stack:
                assert e["ts"] + e["dur"] <= stack[-1] + eps, e  # within its parent
            stack.append(e["ts"] + e["dur"])
            deepest = max(deepest, len(stack))
    return deepest


@pytest.mark.parametrize("level", ["chunk", "layer", "op"])
def test_pipeline_trace_loads_nests_and_pairs_its_flows(level: str, tmp_path: Path) -> None:
    r = pipeline(level)
    events = load(r, tmp_path)
    xs = [e for e in events if e["ph"] == "X"]
    detail = r.trace_detail()
    # the entry's slices are the simulator's own
    top = sorted((s.name, s.start, s.end, s.slot) for s in detail.slices if s.depth == 0)
    assert top == sorted((n, a, b, j) for n, a, b, j, _ in r.slices or [])
    assert max(s.end for s in detail.slices) == pytest.approx(r.step_time_s)
    # nested slices lie within a slice one level up on the same slot
    by_slot = defaultdict(list)
    for s in detail.slices:
        by_slot[(s.slot, s.depth)].append(s)
    for s in detail.slices:
        if s.depth:
            assert any(p.start <= s.start and s.end <= p.end for p in by_slot[(s.slot, s.depth - 1)]), s
    assert check_nesting(xs) == {"chunk": 1, "layer": 2, "op": 3}[level]
    for e in xs:
        assert "flops" in e["args"] and ("op" in e["args"] or "function" in e["args"]), e
        if "op" in e["args"]:
            assert "inputs" in e["args"] and "result_bytes" in e["args"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys()
    assert len(starts) == sum(e["ph"] == "s" for e in events)  # ids are unique
    for k, s in starts.items():
        f = ends[k]
        assert f["bp"] == "e" and f["name"] == s["name"] and (f["pid"], f["tid"]) != (s["pid"], s["tid"])
        for end in (s, f):  # each end sits on a slice of the transfer on its own track
            assert any(x["name"] == s["name"] and (x["pid"], x["tid"]) == (end["pid"], end["tid"])
                       and x["ts"] <= end["ts"] <= x["ts"] + x["dur"] for x in xs)  # fmt: skip
    counters = {e["pid"] for e in events if e["ph"] == "C"}
    assert counters == {s.gpu for s in r.slots}


def test_op_level_leaves_add_up_to_the_simulated_busy_and_comm_time() -> None:
    r = pipeline("op")
    busy = [0.0] * len(r.slots)
    comm = [0.0] * len(r.slots)
    collective = [0.0] * len(r.slots)  # per compute slot, its GPU's collectives on other streams
    compute_of = {s.gpu: j for j, s in enumerate(r.slots) if s.stream == "compute"}
    for s in r.trace_detail().slices:
        if "op" in s.args:  # a leaf: an op, at whatever depth
            (comm if s.comm else busy)[s.slot] += s.end - s.start
            slot = r.slots[s.slot]
            if s.comm and slot.stream != "compute" and s.args["op"] not in ("MeshSend", "Send"):
                collective[compute_of[slot.gpu]] += s.end - s.start
    # the compute stream is also busy for the SMs each collective beside it takes
    # (``distir.sim.interference``): its share of the collective's time
    share = [CLUSTER.device_spec(s.gpu).gemm.comm_sms / CLUSTER.device_spec(s.gpu).gemm.sms for s in r.slots]  # type: ignore[union-attr]
    assert any(collective)
    want = [b + f * c for b, f, c in zip(busy, share, collective, strict=True)]
    assert want == pytest.approx(r.busy_s, rel=1e-9, abs=1e-12)
    assert comm == pytest.approx(r.comm_s, rel=1e-9, abs=1e-12)
    # the second stage's GPUs ran the layers too (bodies carried from the first stage's mesh)
    stage1 = {j for j, s in enumerate(r.slots) if s.gpu >= 2}
    assert any(s.depth == 2 and s.slot in stage1 for s in r.trace_detail().slices)


def test_cli_trace_detail(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    base = ["simulate", "--model", "gpt:layers=2,hidden=128,heads=4", "--strategy", "d1.t1.p2.k2.1f1b"]
    res = CliRunner().invoke(
        app, [*base, "--cluster", "dgx-a100", "--trace", str(out), "--trace-detail", "op", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trace_detail"] == "op"
    assert any(e.get("args", {}).get("op") == "MatMul" for e in json.loads(out.read_text())["traceEvents"])
    bad = CliRunner().invoke(app, [*base, "--trace", str(out), "--trace-detail", "kernel"])
    assert bad.exit_code == 2 and "--trace-detail must be chunk, layer or op" in bad.output
    assert "Traceback" not in bad.output


def _events_of(events: list[dict[str, Any]], gpus: set[int]) -> list[tuple[Any, ...]]:
    """The slices, flows and memory samples of ``gpus`` (flows: both ends traced), comparable."""
    out = []
    ends: dict[int, set[int]] = defaultdict(set)
    for e in events:
        if e["ph"] in ("s", "f"):
            ends[e["id"]].add(e["pid"])
    for e in events:
        if e["pid"] not in gpus or e["ph"] == "M":
            continue
        if e["ph"] in ("s", "f"):
            if ends[e["id"]] <= gpus:
                out.append((e["ph"], e["pid"], e["tid"], e["ts"], e["name"]))
            continue
        out.append((e["ph"], e["pid"], e.get("tid"), e["ts"], e.get("dur"), e["name"], json.dumps(e["args"])))
    return sorted(out)


@pytest.mark.parametrize("level", ["chunk", "op"])
def test_traced_gpus_show_what_the_whole_trace_shows_of_them(level: str, tmp_path: Path) -> None:
    s = parse_strategy(STRATEGY)
    m = distribute(build_model("gpt:layers=4,hidden=256,heads=4", batch=8), s, comm_streams=True)
    whole = load(pipeline(level), tmp_path)
    some = {0, 5}
    part = simulate(m, CLUSTER, device_map(s, True), trace=True, batch=8, trace_detail=level, trace_gpus=some)
    mine = load(part, tmp_path)
    assert {e["pid"] for e in mine} == some
    assert _events_of(mine, some) == _events_of(whole, some)
    assert any(e["ph"] == "X" for e in mine) and any(e["ph"] == "C" for e in mine)
    # flows between the two traced GPUs only: 0 and 5 are on different stages
    ids = {e["id"] for e in mine if e["ph"] in ("s", "f")}
    assert all({e["pid"] for e in mine if e.get("id") == k and e["ph"] in ("s", "f")} <= some for k in ids)


@pytest.mark.parametrize("level", ["chunk", "layer", "op"])
def test_the_event_estimate_bounds_the_trace(level: str, tmp_path: Path) -> None:
    from distir.sim.tracedetail import estimate_events

    r = pipeline(level)
    assert r.trace_source is not None
    shown = [e for e in load(r, tmp_path) if e["ph"] in ("X", "C")]
    est = estimate_events(r.trace_source)
    assert len(shown) <= est <= 4 * len(shown), (len(shown), est)


def test_a_trace_over_the_bound_is_refused_and_says_how_many_gpus_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from distir.limits import Bound
    from distir.sim import simulate as sim_mod
    from distir.sim import tracedetail
    from distir.sim.tracedetail import TraceSizeError, estimate_events

    full = pipeline("chunk")
    assert full.trace_source is not None
    n = estimate_events(full.trace_source)
    small = Bound("on a trace's events", n // 3, "test")
    monkeypatch.setattr(sim_mod, "MAX_TRACE_EVENTS", small)
    monkeypatch.setattr(tracedetail, "MAX_TRACE_EVENTS", small)
    with pytest.raises(TraceSizeError, match=r"8 GPUs at chunk detail.*about (\d+) fit") as err:
        pipeline("chunk")
    fit = int(str(err.value).split("about ")[-1].split(" fit")[0])
    assert 1 <= fit < 8
    s = parse_strategy(STRATEGY)
    m = distribute(build_model("gpt:layers=4,hidden=256,heads=4", batch=8), s, comm_streams=True)
    got = simulate(m, CLUSTER, device_map(s, True), trace=True, batch=8, trace_gpus=range(fit))
    assert got.step_time_s == full.step_time_s
    with pytest.raises(TraceSizeError, match="traced GPU 99 is not one of the program's 8 GPUs"):
        simulate(m, CLUSTER, device_map(s, True), trace=True, batch=8, trace_gpus=[0, 99])


def test_cli_trace_gpus(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    base = ["simulate", "--model", "gpt:layers=2,hidden=128,heads=4", "--strategy", "d2.t1.p2.k2.1f1b"]
    res = CliRunner().invoke(
        app, [*base, "--cluster", "dgx-a100", "--trace", str(out), "--trace-gpus", "0,2-3", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trace_gpus"] == "0,2-3"
    assert {e["pid"] for e in json.loads(out.read_text())["traceEvents"]} == {0, 2, 3}
    for args, message in (
        (["--trace", str(out), "--trace-gpus", "3-1"], "--trace-gpus '3-1': '3-1' is not a GPU or a range"),
        (["--trace", str(out), "--trace-gpus", "x"], "'x' is not a GPU or a range of GPUs like 0-7"),
        (["--trace-gpus", "0"], "--trace-gpus needs --trace"),
        (["--trace-detail", "op"], "--trace-detail needs --trace"),  # was: ignored, no trace
        (["--trace", str(out), "--trace-detail", "ops"], "--trace-detail must be chunk, layer or op"),
        (["--trace", str(out), "--trace-gpus", "7"], "traced GPU 7 is not one of the program's 4 GPUs"),
    ):
        bad = CliRunner().invoke(app, [*base, "--cluster", "dgx-a100", *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output
        assert "Traceback" not in bad.output and len(bad.output.strip().splitlines()) == 1


def test_slice_types_show_mesh_devices_as_ranges(tmp_path: Path) -> None:
    events = load(pipeline("chunk"), tmp_path)
    types = [t for e in events if e["ph"] == "X" for t in e["args"].get("inputs", [])]
    assert any("mesh(" in t for t in types)
    assert not any("d0, d1, d2" in t for t in types)  # runs of three or more are ranges
