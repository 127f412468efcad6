"""The `distir` command's contract: output, --json keys, exit status 2 with FILE:LINE:COL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.cli import app

EX = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_show_prints_canonical_typed_text() -> None:
    code, out, _ = run("show", str(EX / "fig2_mlp_pipeline.distir"))
    assert code == 0
    assert "%ar_1: Tensor[f32, (128, 512), d2] = Send(%as_1, dst=d2)" in out
    code2, out2, _ = run("show", str(EX / "fig2_mlp_pipeline.distir"), "--json")
    data = json.loads(out2)
    assert code2 == 0 and data["entry"] == "mlpPP" and data["text"].strip() == out.strip()


def test_lower_rank_and_all(tmp_path: Path) -> None:
    code, out, _ = run("lower", str(EX / "fig9_zero.distir"), "--rank", "1")
    assert code == 0 and "// rank d1" in out and "rank.Reduce(" in out and "// rank d2" not in out
    code, out, _ = run("lower", str(EX / "fig9_zero.distir"), "--all", "--json")
    data = json.loads(out)
    assert code == 0 and sorted(data["ranks"]) == ["d1", "d2"] and data["deadlock_free"] is True
    code, _, err = run("lower", str(EX / "fig9_zero.distir"), "--rank", "7")
    assert code == 2 and "no rank d7" in err and "d1, d2" in err


def test_exec_is_seeded() -> None:
    code, out, _ = run("exec", str(EX / "fig8_checkpointing.distir"), "--seed", "3", "--json")
    assert code == 0
    data = json.loads(out)
    assert [o["name"] for o in data["outputs"]] == ["%w1_new", "%w2_new"]
    assert data["outputs"][0]["shape"] == [512, 512]
    _, out_again, _ = run("exec", str(EX / "fig8_checkpointing.distir"), "--seed", "3", "--json")
    _, out_other, _ = run("exec", str(EX / "fig8_checkpointing.distir"), "--seed", "4", "--json")
    assert json.loads(out_again) == data and json.loads(out_other) != data


BAD = {
    "parse": ("func @f(%x: Tensor[f33, (2,), d0]) {\n  return %x\n}\n", r":1:20: expected a dtype"),
    "undefined": (
        "func @f(%x: Tensor[f32, (2,), d0]) {\n  %y = Relu(%z)\n  return %y\n}\n",
        r":2:13: use of undefined value %z",
    ),
    "unknown op": (
        "func @f(%x: Tensor[f32, (2,), d0]) {\n  %y = Rellu(%x)\n  return %y\n}\n",
        r":2:3: .*unknown op 'Rellu' \(did you mean Relu",
    ),
    "shape": (
        "func @f(%x: Tensor[f32, (2, 3), d0]) {\n  %y = MatMul(%x, %x)\n  return %y\n}\n",
        r":2:3: while interpreting `%y = MatMul\(%x, %x\)` in @f: MatMul contraction mismatch",
    ),
    "device": (
        "func @f(%x: Tensor[f32, (2,), d0], %z: Tensor[f32, (2,), d1]) {\n"
        "  %y = Add(%x, %z)\n  return %y\n}\n",
        r":2:3: .*Add runs on one device, but %x is on d0 and %z is on d1",
    ),
    "callee device": (
        "func @g(%a, %b) {\n  %c = Add(%a, %b)\n  return %c\n}\n\n"
        "func @f(%x: Tensor[f32, (2,), d0], %z: Tensor[f32, (2,), d1]) {\n"
        "  %y = @g(%x, %z)\n  return %y\n}\n",
        r":2:3: while interpreting `%c = Add\(%a, %b\)` in @g: Add runs on one device, "
        r"but input 1 is on d0 and input 2 is on d1 \[input %b\]",
    ),
    "attr": (
        "func @f(%x: Tensor[f32, (2,), d0]) {\n  %y = Send(%x)\n  return %y\n}\n",
        r":2:3: .*Send requires attribute 'dst'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("command", ["show", "exec", "simulate", "lower --all", "shard"])
def test_errors_exit_2_with_location(tmp_path: Path, case: str, command: str) -> None:
    text, pattern = BAD[case]
    f = tmp_path / "bad.distir"
    f.write_text(text)
    name, *options = command.split()
    code, out, err = run(name, str(f), *options)
    assert code == 2
    assert out == ""
    first = err.splitlines()[0]
    assert first.startswith(str(f) + ":"), first
    assert re.search(pattern, first), first
    assert "Traceback" not in err
    assert f.read_text() == text  # nothing the user wrote is touched


def test_missing_file() -> None:
    code, _, err = run("show", "/nonexistent/x.distir")
    assert code == 2 and "no such file" in err


def test_demo_json() -> None:
    code, out, _ = run("demo", "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True and data["fig4_output_shape"] == [2048, 768]
    assert all(r["rank_vs_global"] == 0.0 for r in data["outputs"])
    assert data["simulation"]["swapped_step_time_s"] > data["simulation"]["step_time_s"] > 0


def test_ops_lists_registry() -> None:
    code, out, _ = run("ops", "--json")
    names = {o["name"] for o in json.loads(out)["ops"]}
    assert code == 0 and {"MatMul", "Send", "AllReduce", "rank.Recv"} <= names


def test_simulate_json_keys_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    code, out, _ = run(
        "simulate",
        str(EX / "fig2_mlp_pipeline.distir"),
        "--cluster",
        "dgx2-v100",
        "--trace",
        str(trace),
        "--batch",
        "256",
        "--json",
    )
    assert code == 0
    d = json.loads(out)
    for key in ("step_time_s", "throughput", "peak_memory_bytes", "oom", "mfu", "bubble_fraction", "devices"):
        assert key in d
    assert d["throughput"] == pytest.approx(256 / d["step_time_s"]) and d["throughput_unit"] == "samples/s"
    assert sorted(d["peak_memory_bytes"]) == ["d1", "d2"] and d["oom"] is False
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "Send" for e in events)


def test_simulate_text_and_errors(tmp_path: Path) -> None:
    code, out, _ = run("simulate", str(EX / "fig9_zero.distir"), "--cluster", "p3.8xlarge")
    assert code == 0 and "step time" in out and "V100" in out
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--cluster", "dgx-a100:0")
    assert code == 2 and "node count" in err and "Traceback" not in err
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--cluster", "nosuch")
    assert code == 2 and "unknown preset 'nosuch'" in err and "dgx2-v100" in err
    bad = tmp_path / "c.toml"
    bad.write_text("[[nodes]]\ntype = 3\n")
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--cluster", str(bad))
    assert code == 2 and "nodes" in err
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--device-map", "d1=0")
    assert code == 2 and "does not place d2" in err
    prog = tmp_path / "p.distir"
    prog.write_text((EX / "fig2_mlp_pipeline.distir").read_text())
    code, _, err = run("simulate", str(prog), "--trace", str(prog))
    assert code == 2 and "refusing to overwrite" in err
    assert prog.read_text() == (EX / "fig2_mlp_pipeline.distir").read_text()


def test_clusters_lists_presets() -> None:
    code, out, _ = run("clusters", "--json")
    assert code == 0
    names = {c["preset"] for c in json.loads(out)["clusters"]}
    assert {"dgx2-v100", "dgx-a100", "h100", "p3.8xlarge", "g4dn.12xlarge", "local"} <= names


def test_shard_stages_and_errors(tmp_path: Path) -> None:
    prog = tmp_path / "mlp.distir"
    prog.write_text(
        "func @mlp(%x: Tensor[f32, (8, 16), d0], %w1: Tensor[f32, (16, 64), d0], "
        "%w2: Tensor[f32, (64, 16), d0]) {\n  %h = MatMul(%x, %w1)\n  %a = Gelu(%h)\n"
        "  %y = MatMul(%a, %w2)\n  return %y\n}\n"
    )
    base = ["shard", str(prog), "--mesh", "tp=2", "--annotate", "w1=S(1)", "--annotate", "w2=S(0)"]
    code, out, _ = run(*base, "--stage", "legalize")
    assert code == 0 and 'Redistribute(%y, to="R")' in out and "[S(1)]" in out
    code, out, _ = run(*base, "--json")
    d = json.loads(out)
    assert code == 0 and d["communication"] == {"AllReduce": 1} and "%w1.d1" in d["text"]
    code, out, _ = run(*base, "--stage", "ranks", "--json")
    assert code == 0 and [g["devices"] for g in json.loads(out)["ranks"]] == [["d0", "d1"]]
    code, _, err = run("shard", str(prog), "--annotate", "w9=S(1)")
    assert code == 2 and "%w9" in err
    code, _, err = run("shard", str(prog), "--annotate", "w1=S(7)")
    assert code == 2 and "out of range" in err
    code, _, err = run("shard", str(prog), "--mesh", "tp=x")
    assert code == 2 and "tp=4" in err


def test_errors_at_run_time_and_untyped_entries_are_located(tmp_path: Path) -> None:
    rt = tmp_path / "rt.distir"
    rt.write_text(
        "func @f(%x: Tensor[f32, (4,), d0]) {\n  %i = Constant(value=[7], device=d0)\n"
        "  %y = Gather(%x, %i, axis=0)\n  return %y\n}\n"
    )
    code, _, err = run("exec", str(rt))
    assert code == 2 and err.startswith(f"{rt}:3:3: ") and "out of range" in err
    untyped = tmp_path / "u.distir"
    untyped.write_text("func @f(%x) {\n  return %x\n}\n")
    code, _, err = run("show", str(untyped))
    assert code == 2 and err.startswith(f"{untyped}:1:9: ") and "has no type" in err


def test_parse_positions_are_linear_and_right() -> None:
    from distir.ir.parser import parse_with_positions

    lines = ["func @f(%x: Tensor[f32, (4,), d0]) {"]
    lines += [f"  %y{i} = Relu(%x)" for i in range(3000)]
    lines += ["  return %x", "}"]
    m, pos = parse_with_positions("\n".join(lines))
    body = m.entry.body
    assert pos[body[0]] == (2, 3) and pos[body[-1]] == (3001, 3)


def test_sharded_programs_lower_and_simulate_through_materialization(tmp_path: Path) -> None:
    prog = tmp_path / "mlp.distir"
    prog.write_text(
        "func @mlp(%x: Tensor[f32, (8, 16), d0], %w1: Tensor[f32, (16, 64), d0], "
        "%w2: Tensor[f32, (64, 16), d0]) {\n  %h = MatMul(%x, %w1)\n  %a = Gelu(%h)\n"
        "  %y = MatMul(%a, %w2)\n  return %y\n}\n"
    )
    code, out, _ = run(
        "shard", str(prog), "--annotate", "w1=S(1)", "--annotate", "w2=S(0)", "--stage", "optimize"
    )
    sharded = tmp_path / "mlp_tp2.distir"
    sharded.write_text(out)
    assert code == 0 and "DTensor[" in out
    code, out, _ = run("simulate", str(sharded), "--cluster", "dgx-a100", "--json")
    d = json.loads(out)
    assert code == 0 and sorted(d["peak_memory_bytes"]) == ["d0", "d1"]
    assert all(dev["comm_s"] > 0 for dev in d["devices"])  # the AllReduce
    code, out, _ = run("lower", str(sharded), "--rank", "1")
    assert code == 0 and "rank.AllReduce(" in out and "%w1.d1: Tensor[f32, (16, 32), d1]" in out


def test_simulate_a_zoo_model_under_a_strategy(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    tiny = "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=128"
    code, out, _ = run(
        "simulate", "--model", tiny, "--strategy", "d2.t2.p2.k4.1f1b", "--batch", "16", "--json",
        "--trace", str(trace),
    )  # fmt: skip
    assert code == 0
    d = json.loads(out)
    assert d["strategy"] == "d2.t2.p2.k4.1f1b"
    assert {"step_time_s", "throughput", "peak_memory_bytes", "oom", "bubble_fraction", "mfu"} <= set(d)
    assert d["step_time_s"] > 0 and 0 < d["bubble_fraction"] < 1
    assert len([k for k in d["peak_memory_bytes"]]) >= 8
    assert json.loads(trace.read_text())["traceEvents"]
    # inference does less work than training on the same strategy
    code, out2, _ = run(
        "simulate", "--model", tiny, "--strategy", "d2.t2.p2.k4.gpipe", "--batch", "16", "--infer", "--json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out2)["flops"] < d["flops"] / 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt9"], "unknown model 'gpt9'"),
        (
            ["--model", "mlp:layers=2,hidden=8", "--strategy", "d2.k3", "--batch", "8"],
            "does not split into k=3",
        ),
        (
            ["--model", "mlp:layers=2,hidden=8", "--strategy", "d32", "--batch", "32"],
            "needs 32 GPUs but dgx2-v100 has 16",
        ),
        (["--model", "mlp:layers=2,hidden=8", "--strategy", "d2.x9"], "unknown part 'x9'"),
        ([], "give a program FILE or --model"),
    ],
)
def test_simulate_model_errors(args: list[str], message: str) -> None:
    code, out, err = run("simulate", *args)
    assert code == 2
    assert message in out + err


def test_simulate_defaults_to_the_searchs_numerics() -> None:
    """Without --dtype and --precision, simulate trains as search does: mixed precision in the
    GPUs' fast half (bf16 on A100, f16 on V100), pure f32 for inference in f32 and an f32 --dtype;
    inference in the half format pure."""
    base = ["simulate", "--model", "mlp:layers=2,hidden=64", "--batch", "8", "--json"]
    for cluster, dtype in (("dgx-a100", "bf16"), ("dgx2-v100", "f16")):
        code, out, _ = run(*base, "--cluster", cluster)
        assert code == 0
        d = json.loads(out)
        assert (d["dtype"], d["precision"]) == (dtype, "mixed")
        code, out, _ = run(*base, "--cluster", cluster, "--infer")
        assert code == 0 and (json.loads(out)["dtype"], json.loads(out)["precision"]) == (dtype, "pure")
    code, out, _ = run(*base, "--dtype", "f32")
    assert code == 0 and json.loads(out)["precision"] == "pure"
    code, _, err = run(*base, "--dtype", "f8")
    assert code == 2 and "--dtype must be auto, f32, bf16 or f16, got 'f8'" in err


def test_simulate_mixed_precision() -> None:
    """``--precision mixed`` computes in --dtype with fp32 masters and state: with Adam the step's
    parameters hold 14 bytes per weight (4 master + 8 m, v + the persistent bf16 copy) where pure
    bf16 holds 6."""
    model = "mlp:layers=2,hidden=64"
    base = ["simulate", "--model", model, "--batch", "8", "--json"]
    got = {}
    for dtype, precision in (("bf16", "pure"), ("bf16", "mixed"), ("f16", "mixed")):
        code, out, _ = run(*base, "--dtype", dtype, "--precision", precision)
        assert code == 0
        d = json.loads(out)
        assert (d["dtype"], d["precision"]) == (dtype, precision)
        got[dtype, precision] = d["parameter_bytes"]["d0"]
    n = 2 * 64 * 64
    assert got["bf16", "mixed"] - got["bf16", "pure"] == 8 * n
    assert got["f16", "mixed"] == got["bf16", "mixed"]
    code, _, err = run(*base, "--dtype", "f32", "--precision", "mixed")
    assert code == 2 and "--precision mixed computes in a half format" in err
    code, _, err = run(*base, "--dtype", "bf16", "--precision", "half")
    assert code == 2 and "--precision must be auto, mixed, pure, fp8 or fp8-delayed, got 'half'" in err
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--precision", "mixed")
    assert code == 2 and "--precision applies to --model" in err


def test_simulate_fp8_precision() -> None:
    """``--precision fp8`` runs the linear layers in float8 on a GPU with FP8 tensor cores (a
    faster step than mixed on H100 where the GEMMs are large; on small ones the casts cost more
    than the products save); a GPU without them is a one-line error, as is fp8 of a model not
    in bf16."""
    model = "llama:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=4096,seq=4096"
    base = ["simulate", "--model", model, "--strategy", "d2.t2.sp", "--batch", "16", "--dtype", "bf16"]
    steps = {}
    for precision in ("mixed", "fp8"):
        code, out, err = run(*base, "--cluster", "h100", "--precision", precision, "--json")
        assert code == 0, err
        d = json.loads(out)
        assert d["precision"] == precision
        steps[precision] = d["step_time_s"]
    assert steps["fp8"] < steps["mixed"]
    code, out, err = run(*base, "--cluster", "dgx-a100", "--precision", "fp8")
    assert code == 2 and "needs FP8 tensor cores; A100-SXM-80GB has none" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run(*base[:-2], "--cluster", "h100", "--dtype", "f16", "--precision", "fp8")
    assert code == 2 and "fp8 precision computes what is not float8 in bf16" in err


def test_simulate_fp8_weight_cache() -> None:
    """``--fp8-weight-cache`` (on with ``--trainer megatron`` under fp8-delayed) holds one float8
    copy of a pipeline stage's weights: less memory on the first stage of a 1F1B pipeline and a
    shorter step (one cast per weight, not one per microbatch); a program file refuses it."""
    model = "llama:layers=4,hidden=512,heads=8,kv_heads=8,ffn=1536,vocab=512,seq=256"
    base = ["simulate", "--model", model, "--strategy", "d1.t1.p2.k8.1f1b", "--batch", "8", "--dtype", "bf16"]
    base += ["--precision", "fp8-delayed", "--cluster", "h100", "--json"]
    got = {}
    for extra in (
        [],
        ["--fp8-weight-cache"],
        ["--trainer", "megatron"],
        ["--trainer", "megatron", "--fp8-weight-cache"],
    ):
        code, out, err = run(*base, *extra)
        assert code == 0, err
        got[" ".join(extra)] = json.loads(out)
    plain, cached = got[""], got["--fp8-weight-cache"]
    assert cached["peak_memory_bytes"]["d0"] < plain["peak_memory_bytes"]["d0"]
    assert cached["step_time_s"] < plain["step_time_s"]
    assert got["--trainer megatron"] == got["--trainer megatron --fp8-weight-cache"]
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--fp8-weight-cache")
    assert code == 2 and "--fp8-weight-cache" in err


def test_simulate_float8_all_gather() -> None:
    """``--float8-all-gather`` (torchtitan's FSDP2 under torchao's float8) gathers the linear
    weights in float8: a shorter step, reported in the JSON; without --precision fp8, without
    --trainer torchtitan, without FSDP's sharding or without recomputation, a one-line error."""
    model = "llama:layers=4,hidden=512,heads=8,kv_heads=8,ffn=1536,vocab=512,seq=256"
    base = ["simulate", "--model", model, "--batch", "8", "--dtype", "bf16", "--cluster", "h100", "--json"]
    fsdp = [*base, "--strategy", "d8.t1.p1.k1.1f1b.z3.rops", "--trainer", "torchtitan"]
    got = {}
    for extra in ([], ["--float8-all-gather"]):
        code, out, err = run(*fsdp, "--precision", "fp8", *extra)
        assert code == 0, err
        got[bool(extra)] = json.loads(out)
    assert got[True]["float8_all_gather"] and not got[False]["float8_all_gather"]
    assert got[True]["step_time_s"] < got[False]["step_time_s"]
    titan_fp8 = ["--trainer", "torchtitan", "--precision", "fp8"]
    for args, what in (
        ([*fsdp, "--precision", "mixed"], "--precision fp8"),
        ([*base, "--strategy", "d8.t1.p1.k1.1f1b.z3.rops", "--precision", "fp8"], "--trainer torchtitan"),
        ([*base, "--strategy", "d8.t1.p1.k1.1f1b.z1.rops", *titan_fp8], "is FSDP's gather"),
        ([*base, "--strategy", "d8.t1.p1.k1.1f1b.z3.rops", *titan_fp8, "--infer"], "--float8-all-gather"),
        ([*base, "--strategy", "d8.t1.p1.k1.1f1b.z3", *titan_fp8], "recomputed"),
    ):
        code, out, err = run(*args, "--float8-all-gather")
        assert code == 2 and what in err and "Traceback" not in err, err


def test_simulate_master_remainders() -> None:
    """``--master-remainders`` keeps each ZeRO-1 master shard as an int16 remainder beside the bf16
    copy: a smaller peak; ZeRO-3, or a program file, is a one-line error."""
    model = "llama:layers=4,hidden=512,heads=8,kv_heads=8,ffn=1536,vocab=512,seq=256"
    base = ["simulate", "--model", model, "--batch", "8", "--dtype", "bf16", "--precision", "mixed"]
    base += ["--optimizer", "adam", "--cluster", "dgx-a100", "--json"]
    got = {}
    for extra in ([], ["--master-remainders"]):
        code, out, err = run(*base, "--strategy", "d2.t1.p1.k2.1f1b.z1", *extra)
        assert code == 0, err
        got[" ".join(extra)] = json.loads(out)
    assert got["--master-remainders"]["peak_memory_bytes"]["d0"] < got[""]["peak_memory_bytes"]["d0"]
    code, _, err = run(*base, "--strategy", "d2.t1.p1.k2.1f1b.z3", "--master-remainders")
    assert code == 2 and "ZeRO-1" in err and len(err.strip().splitlines()) == 1
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--master-remainders")
    assert code == 2 and "--master-remainders" in err


def test_simulate_optimizer_dtype() -> None:
    """``--optimizer-dtype bf16`` keeps no fp32 masters (bf16 m and v): a smaller peak, the JSON's
    ``optimizer_dtype``; f16 beside bf16 compute, pure precision, ``--infer`` and a program file
    are one-line errors."""
    model = "llama:layers=4,hidden=512,heads=8,kv_heads=8,ffn=1536,vocab=512,seq=256"
    base = ["simulate", "--model", model, "--batch", "8", "--dtype", "bf16", "--optimizer", "adam"]
    base += ["--cluster", "dgx-a100", "--json", "--strategy", "d2.t1.p1.k2.1f1b.z1"]
    got = {}
    for dt in ("f32", "bf16"):
        code, out, err = run(*base, "--precision", "mixed", "--optimizer-dtype", dt)
        assert code == 0, err
        got[dt] = json.loads(out)
        assert got[dt]["optimizer_dtype"] == dt
    assert got["bf16"]["peak_memory_bytes"]["d0"] < got["f32"]["peak_memory_bytes"]["d0"]
    for extra, what in (
        (["--precision", "mixed", "--optimizer-dtype", "f16"], "compute dtype bf16"),
        (["--precision", "pure", "--optimizer-dtype", "bf16"], "mixed precision"),
        (["--precision", "mixed", "--optimizer-dtype", "bf16", "--infer"], "--optimizer-dtype bf16"),
    ):
        code, _, err = run(*base, *extra)
        assert code == 2 and what in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--optimizer-dtype", "bf16")
    assert code == 2 and "--optimizer-dtype" in err


def test_simulate_offload_optimizer() -> None:
    """``--offload-optimizer`` keeps the masters and Adam's state on the hosts: the GPU's parameter
    bytes fall by 12 per partition parameter, which the JSON reports as host memory; a node type
    without a host, ZeRO-0, pure precision, another trainer's run or a program file is a one-line
    error."""
    model = "gpt:layers=4,hidden=512,heads=8,seq=128,vocab=512"
    base = ["simulate", "--model", model, "--batch", "8", "--dtype", "f16", "--precision", "mixed"]
    base += ["--optimizer", "adam", "--json", "--strategy"]
    got = {}
    for extra in ([], ["--offload-optimizer"]):
        code, out, err = run(*base, "d8.t1.p1.k1.z3", "--cluster", "ndm-a100-v4", *extra)
        assert code == 0, err
        got[" ".join(extra)] = json.loads(out)
    on, off = got["--offload-optimizer"], got[""]
    saved = off["parameter_bytes"]["d0"] - on["parameter_bytes"]["d0"]
    assert saved == on["host_memory_bytes"]["d0"] > 0 and off["host_memory_bytes"]["d0"] is None
    assert on["peak_memory_bytes"]["d0"] < off["peak_memory_bytes"]["d0"]
    assert any(d["stream"] == "host" and d["busy_s"] > 0 for d in on["devices"])
    for args, words in (
        (["d8.t1.p1.k1.z3", "--cluster", "dgx-a100"], "describes no host"),
        (["d8.t1.p1.k1", "--cluster", "ndm-a100-v4"], "ZeRO 1-3"),
        (["d8.t1.p1.k1.z3", "--cluster", "ndm-a100-v4", "--trainer", "megatron"], "not megatron's"),
    ):
        code, _, err = run(*base, *args, "--offload-optimizer")
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--offload-optimizer")
    assert code == 2 and "--offload-optimizer" in err


def test_simulate_zero3_fetch() -> None:
    """``--zero3-fetch deepspeed`` (on with ``--trainer deepspeed`` under ZeRO-3) gathers module by
    module under DeepSpeed's live-parameter cap, not a whole layer with the next one ahead: a
    smaller peak; ``layer`` turns the trainer's off; a malformed text, or a program file, is a
    one-line error."""
    model = "gpt:layers=3,hidden=512,heads=8,vocab=512,seq=128"
    base = ["simulate", "--model", model, "--strategy", "d2.t1.p1.k1.z3", "--batch", "8", "--dtype", "f16"]
    base += ["--precision", "mixed", "--cluster", "dgx-a100", "--json"]
    got = {}
    for extra in (
        [],
        ["--zero3-fetch", "deepspeed:max_live=0,prefetch_bucket=0,max_reuse=0"],
        ["--trainer", "deepspeed"],
        ["--trainer", "deepspeed", "--zero3-fetch", "deepspeed"],
        ["--trainer", "deepspeed", "--zero3-fetch", "layer"],
        ["--trainer", "deepspeed", "--zero3-fetch", "layer"],
    ):
        code, out, err = run(*base, *extra)
        assert code == 0, err
        got[" ".join(extra)] = json.loads(out)
    one = got["--zero3-fetch deepspeed:max_live=0,prefetch_bucket=0,max_reuse=0"]
    assert one["peak_memory_bytes"]["d0"] < got[""]["peak_memory_bytes"]["d0"]
    ds = got["--trainer deepspeed"]
    assert ds == got["--trainer deepspeed --zero3-fetch deepspeed"]
    assert ds["peak_memory_bytes"] != got["--trainer deepspeed --zero3-fetch layer"]["peak_memory_bytes"]
    code, _, err = run(*base, "--zero3-fetch", "deepspeed:live=1")
    assert code == 2 and "--zero3-fetch" in err and len(err.strip().splitlines()) == 1
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--zero3-fetch", "deepspeed")
    assert code == 2 and "--zero3-fetch" in err


def test_simulate_refuses_a_zero3_fetch_or_remainders_it_would_ignore() -> None:
    """``--zero3-fetch deepspeed`` with no ZeRO-3 shards to gather (ZeRO 0-2, d·c = 1) or under a
    trainer whose ZeRO-3 gathers whole layers, and ``--master-remainders`` under DeepSpeed, are
    one-line errors, not runs without them; ``layer`` (what ZeRO-3 does anyway) is taken."""
    model = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"
    base = ["simulate", "--model", model, "--batch", "8", "--cluster", "dgx-a100"]
    refused = [
        (["--strategy", "d2.z2", "--zero3-fetch", "deepspeed"], "d2.t1.p1.k1.1f1b.z2 has none to gather"),
        (["--strategy", "d1.z3", "--zero3-fetch", "deepspeed:max_live=9"], "has none to gather"),
        (["--strategy", "d2.z3", "--zero3-fetch", "deepspeed", "--trainer", "megatron"], "not megatron's"),
        (["--strategy", "d2.z1", "--master-remainders", "--trainer", "deepspeed"], "not DeepSpeed's"),
    ]
    for extra, message in refused:
        code, _, err = run(*base, *extra)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (extra, err)
    for strategy in ("d2.z2", "d2.z3"):
        code, _, err = run(*base, "--strategy", strategy, "--zero3-fetch", "layer")
        assert code == 0, err


def test_simulate_refuses_the_deepspeed_pipeline_engine_without_a_pipeline() -> None:
    """``--deepspeed-pipe`` with p = 1 has no pipeline to run (it was taken and meant nothing):
    a one-line error; with p > 1 it runs, and ``--trainer deepspeed`` at p = 1 still runs."""
    model = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"
    base = ["simulate", "--model", model, "--batch", "8", "--cluster", "dgx-a100"]
    code, _, err = run(*base, "--strategy", "d2.z1", "--deepspeed-pipe")
    assert code == 2 and "d2.t1.p1.k1.1f1b.z1 has one" in err and len(err.strip().splitlines()) == 1
    taken = (
        ["--strategy", "d1.p2.k2", "--deepspeed-pipe"],
        ["--strategy", "d2.z1", "--trainer", "deepspeed"],
    )
    for extra in taken:
        code, _, err = run(*base, *extra)
        assert code == 0, (extra, err)


def test_simulate_as_a_trainer_runs_it() -> None:
    """``--trainer`` runs the plan as that trainer does (``distir.parallel.trainers``): Megatron's
    fp32 gradients take 2 bytes a parameter more than the neutral program's, torchtitan's eager
    kernels and Megatron's cuDNN attention on H100 are the defaults an explicit --kernels or
    --attention-kernel overrides; a trainer that cannot run the strategy, a program file with
    --trainer and an unknown trainer are one-line errors."""
    model = "llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1024,seq=64"
    base = ["simulate", "--model", model, "--strategy", "d2.z1", "--batch", "8", "--dtype", "bf16"]
    base += ["--precision", "mixed", "--cluster", "h100", "--json"]
    got = {}
    for trainer in ("distir", "megatron"):
        code, out, err = run(*base, "--trainer", trainer)
        assert code == 0, err
        got[trainer] = json.loads(out)
    assert got["distir"]["trainer"] == "distir" and got["megatron"]["trainer"] == "megatron"
    assert (got["distir"]["kernels"], got["distir"]["attention_kernel"]) == ("fused", "fa2")
    assert got["megatron"]["attention_kernel"] == "cudnn"
    assert max(got["megatron"]["peak_memory_bytes"].values()) > max(
        got["distir"]["peak_memory_bytes"].values()
    )
    z3 = [b.replace("d2.z1", "d2.z3") for b in base]
    code, out, _ = run(*z3, "--trainer", "torchtitan")
    assert code == 0 and json.loads(out)["kernels"] == "eager"
    code, out, _ = run(*z3, "--trainer", "torchtitan", "--kernels", "fused")
    assert code == 0 and json.loads(out)["kernels"] == "fused"
    refused = [
        (["--trainer", "torchtitan"], "torchtitan applies mixed precision through FSDP2 only"),
        (["--trainer", "nemo"], "--trainer must be one of distir, megatron, deepspeed, torchtitan"),
        (["--trainer", "megatron", "--infer"], "so --trainer megatron, ZeRO-1 (z1) would be ignored"),
        (["--trainer", "megatron", "--fp32-grad-accum"], "is DeepSpeed's BF16_Optimizer, not megatron's"),
        (["--trainer", "deepspeed", "--overlap-param-gather"], "not DeepSpeed's"),
        (["--trainer", "megatron", "--bucket-mb", "50"], "Megatron-LM sizes its buckets itself"),
    ]
    for extra, message in refused:
        code, _, err = run(*base, *extra)
        assert code == 2 and message in err, (extra, err)
        assert len(err.strip().splitlines()) == 1
    pure = [b.replace("mixed", "pure") for b in base]
    code, _, err = run(*pure, "--trainer", "megatron")
    assert code == 2 and "keeps fp32 master weights" in err
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--trainer", "megatron")
    assert code == 2 and "--trainer apply to --model" in err


def test_simulate_launch_blocking() -> None:
    """``--launch-blocking``: a pipeline with send and reduction streams runs each GPU's kernels
    in series, with the host's time per kernel; the JSON says so; not with --tp-comm-overlap."""
    base = ["simulate", "--model", "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128"]
    base += ["--strategy", "d2.t2.p2.k4.1f1b", "--batch", "8", "--cluster", "p3.8xlarge:2", "--json"]
    got = {}
    for extra in ([], ["--launch-blocking"]):
        code, out, err = run(*base, *extra)
        assert code == 0, err
        got[bool(extra)] = json.loads(out)
    assert got[False]["launch_blocking"] is False and got[True]["launch_blocking"] is True
    assert got[True]["step_time_s"] > got[False]["step_time_s"]
    code, _, err = run(*base, "--launch-blocking", "--tp-comm-overlap")
    assert code == 2 and "--launch-blocking runs one kernel at a time" in err


def test_simulate_bucket_size() -> None:
    """``--bucket-mb``: smaller buckets start reducing earlier, so ZeRO-2 holds less unreduced
    gradient at once; a size that is not positive is a one-line error; a program file has none."""
    base = ["simulate", "--model", "mlp:layers=8,hidden=256", "--strategy", "d4.t1.p1.k2.1f1b.z2", "--json"]
    peaks = {}
    for mb in ("0.25", "25"):
        code, out, _ = run(*base, "--bucket-mb", mb)
        assert code == 0
        peaks[mb] = max(json.loads(out)["peak_memory_bytes"].values())
    assert peaks["0.25"] < peaks["25"]
    code, _, err = run(*base, "--bucket-mb", "0")
    assert code == 2 and "gradient bucket size must be positive" in err
    code, _, err = run("simulate", str(EX / "fig2_mlp_pipeline.distir"), "--bucket-mb", "1")
    assert code == 2 and "--bucket-mb applies to --model" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["search", "--batch", "0"], "distir search: Invalid value for '--batch'"),
        (["simulate", "--bogus"], "distir simulate: No such option: --bogus"),
        (["search", "--zero", "4"], "distir search: Invalid value for '--zero'"),
    ],
)
def test_usage_errors_are_one_line_with_status_2(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script (``main``) turns a usage error into one line naming the command."""
    from distir.cli import main

    monkeypatch.setattr("sys.argv", ["distir", *argv])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_main_passes_exit_codes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from distir.cli import main

    monkeypatch.setattr("sys.argv", ["distir", "ops", "--json"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 0
    monkeypatch.setattr("sys.argv", ["distir", "show", "/nonexistent.distir"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2


def test_a_trainer_builds_its_model_options_unless_the_model_sets_them() -> None:
    base = [
        "simulate",
        "--strategy",
        "d2.t2.sp.z3",
        "--batch",
        "4",
        "--dtype",
        "bf16",
        "--precision",
        "mixed",
    ]
    base += ["--cluster", "h100", "--json"]
    llama = "llama:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=1024,seq=64"
    cases = [
        ("torchtitan", llama, [], llama + ",norm=composite,rope=fp32,silu=fused,kv=copy,loss=parallel"),
        ("torchtitan", llama + ",loss=torch", ["--kernels", "fused"], llama + ",loss=torch"),
        ("megatron", llama, [], llama + ",qkv=fused"),
        ("distir", llama, [], llama),
    ]
    for trainer, model, extra, built in cases:
        code, out, err = run(*base, "--model", model, "--trainer", trainer, *extra)
        assert code == 0, err
        assert json.loads(out)["model_built"] == built
    code, out, err = run(*base, "--model", " gpt2-117m: ", "--trainer", "megatron")  # an empty option list
    assert code == 0, err
    assert json.loads(out)["model_built"] == "gpt2-117m:qkv=fused"
    code, out, err = run(
        *[x if x != "d2.t2.sp.z3" else "d2.t2.z3" for x in base],
        "--model",
        "mlp:layers=2,hidden=64",
        "--trainer",
        "megatron",
    )
    assert code == 0, err
    assert json.loads(out)["model_built"] == "mlp:layers=2,hidden=64"  # no such option in its family


def test_validate_table_never_cuts_a_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an 80-column terminal (rich's width when stdout is not one) the strategy column folds,
    as the search's does; it was cut to `d1.t2.sp.p1.k4.1f1…`, which names no run."""
    import io

    from rich.console import Console

    from distir import cli
    from distir.backend.validate import Fidelity, Point
    from distir.report.fidelity import ErrorStats

    long = "d1.t2.sp.p1.k4.1f1b.rfull.L1-1"
    stats = ErrorStats(0.1, 0.1)
    f = Fidelity("m", 4, 2, "c", "tracked", [Point(long, 0.05, 0.09, 2**16, 2**16)], 1.0, stats, stats)
    buf = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=buf, width=80, highlight=False))
    cli._print_points(f)
    lines = buf.getvalue().splitlines()[1:]
    assert "…" not in buf.getvalue() and "".join(line.split()[0] for line in lines) == long
    assert lines[0].split()[1:] == [
        "50.00",
        "ms",
        "90.00",
        "ms",
        "+80.0%",
        "0.06",
        "MiB",
        "0.06",
        "MiB",
        "+0.0%",
    ]


def _documented_keys(command: str) -> list[str]:
    """The top-level keys docs/cli.md lists for ``command --json`` (what parentheses say of a
    key left out)."""
    text = (Path(__file__).parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    m = re.search(rf"^- `{command} --json`[^:]*: (.*?)(?=^- `|\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, command
    body, depth, kept = m.group(1), 0, []
    for ch in body:
        depth += ch == "("
        if depth == 0:
            kept.append(ch)
        depth -= ch == ")"
    return re.findall(r"`(\w+)`", "".join(kept))


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("import", ["import", "tests.frontends.torch_models:mlp"]),
        ("export", ["export", "--to", "fsdp", "--model", "mlp", "--strategy", "d2", "--batch", "4"]),
        (
            "run",
            ["run", "--model", "mlp:layers=2,hidden=4", "--strategy", "d2", "--batch", "4", "--steps", "2"],
        ),
    ],
)
def test_documented_json_keys_are_the_output_s(command: str, args: list[str]) -> None:
    """docs/cli.md's key list of each command is its JSON object's keys, in order."""
    if command in ("import", "run"):
        pytest.importorskip("torch")
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.stderr
    assert list(json.loads(r.stdout)) == _documented_keys(command)


def test_python_dash_m_distir_runs_the_console_script() -> None:
    """``python -m distir`` is the ``distir`` command (a checkout run without installing it):
    its output, and a user error's one line and status 2."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    ok = subprocess.run(
        [sys.executable, "-m", "distir", "show", str(EX / "fig2_mlp_pipeline.distir"), "--json"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert ok.returncode == 0 and json.loads(ok.stdout)["entry"] == "mlpPP"
    bad = subprocess.run(
        [sys.executable, "-m", "distir", "show", "no-such.distir"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--episodes", "99999999999", "--episodes = 99,999,999,999 is above distir's bound of 100,000"),
        ("--seconds", "1e9", "--seconds = 1,000,000,000 is above distir's bound of 86,400"),
    ],
)
def test_an_automap_budget_past_its_bound_is_refused_before_searching(
    option: str, value: str, words: str
) -> None:
    """``shard --auto --episodes 99999999999`` searched on past minutes (no --seconds: no end in
    sight); a budget is bounded as every other count a user writes (docs/limitations.md)."""
    model = "gpt:layers=1,hidden=64,heads=2,seq=32,vocab=100"
    code, out, err = run("shard", "--model", model, "--mesh", "tp=2", "--auto", "tp", option, value)
    assert code == 2 and out == "" and words in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["run", "validate"])
def test_steps_past_their_bound_are_refused_before_any_process_starts(command: str) -> None:
    """``run --steps 99999999999`` ran on with no end and no progress (every step's time kept)."""
    model = "gpt:layers=1,hidden=64,heads=2,seq=32,vocab=100"
    extra = ["--strategy", "d1", "--batch", "1"] if command == "run" else ["--cluster", "dgx-a100"]
    code, out, err = run(command, "--model", model, *extra, "--steps", "99999999999")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--steps = 99,999,999,999 is above distir's bound of 100,000" in err
