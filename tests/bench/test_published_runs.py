"""The published-runs data file (bench/published_runs.toml) and what validate_published.py derives
from each record: the file parses, every run has a source and the fields the bench needs, maps
onto a zoo model, a strategy and a cluster distir accepts; the loader names bad records. Not a
test of the prediction errors (the bench prints those)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from distir.frontends.zoo.registry import build_model, parse_model_string
from distir.ir.types import DType

from .scripts import load_script

vp = load_script("validate_published")
RUNS = vp.load_runs()
SUPPORTED = [r for r in RUNS if not vp.unsupported(r)]


def test_at_least_15_supported_runs_from_several_sources() -> None:
    assert len(SUPPORTED) >= 15
    repos = {re.match(r"https://github.com/([^/]+/[^/]+)/", r.source).group(1) for r in RUNS}  # type: ignore[union-attr]
    assert len(repos) >= 3


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_every_run_has_a_source_at_a_commit(run: object) -> None:
    assert run.source.startswith("https://")  # type: ignore[attr-defined]
    assert re.fullmatch(r"[0-9a-f]{40}", run.commit)  # type: ignore[attr-defined]
    assert run.commit in run.source  # type: ignore[attr-defined]
    assert len(run.where) > 20  # type: ignore[attr-defined]
    assert run.published.value > 0 and run.published.fit in (True, False)  # type: ignore[attr-defined]


@pytest.mark.parametrize("run", SUPPORTED, ids=lambda r: r.name)
def test_supported_run_maps_onto_distir(run: object) -> None:
    m, s, c = run.model, run.strategy, run.cluster  # type: ignore[attr-defined]
    cfg = parse_model_string(vp.zoo_model(m)).config
    for key in ("layers", "hidden", "heads", "seq", "vocab"):
        assert getattr(cfg, key) == getattr(m, key)
    if m.family in ("llama", "nemotron"):
        assert (cfg.kv_heads, cfg.ffn) == (m.kv_heads, m.ffn)
    st = vp.strategy_of(s)
    assert st.d * st.k * s.microbatch == s.global_batch  # k whole microbatches per replica
    assert st.devices == c.gpus
    assert vp.cluster_of(c).num_devices >= c.gpus


def test_megatron_flops_equals_the_closed_form() -> None:
    # Narayanan et al. 2021, eq. (3) without recomputation: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
    m = vp.ModelCfg(
        "gpt", layers=24, hidden=2048, heads=16, kv_heads=16, ffn=8192, vocab=131072, seq=4096, notes=""
    )
    b, s, h, L, V = 192, 4096, 2048, 24, 131072
    want = 72 * b * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert vp.megatron_flops(m, b) == pytest.approx(want, rel=1e-12)


def test_megatron_recompute_flops_equals_the_closed_form() -> None:
    # with full recomputation: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)), the formula the DeepSpeed
    # Azure post states and the OPT-175B compute figure follows
    m = vp.ModelCfg(
        "gpt", layers=96, hidden=12288, heads=96, kv_heads=96, ffn=49152, vocab=50272, seq=2048, notes=""
    )
    b, s, h, L, V = 992, 2048, 12288, 96, 50272
    want = 96 * b * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert vp.megatron_flops(m, b, recompute=True) == pytest.approx(want, rel=1e-12)
    # the OPT final update's ~4.30E+23 FLOPs for 300B tokens is this formula per token
    assert vp.megatron_flops(m, 1, recompute=True) / s * 300e9 == pytest.approx(4.30e23, rel=5e-3)


def test_fp16_runs_are_built_in_f16_with_mixed_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    import distir.frontends.zoo.registry as registry

    fp16 = [r for r in RUNS if r.precision == "fp16-mixed"]
    assert {r.name for r in fp16} >= {"opt-175b", "deepspeed-azure-175b-s512-g256"}
    assert vp.PRECISIONS["fp16-mixed"] == "mixed"
    built: list[DType] = []
    real = registry.build_model

    def spy(spec: str, **kw: object) -> object:
        built.append(kw["dtype"])  # type: ignore[arg-type]
        return real(spec, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(registry, "build_model", spy)
    r = next(r for r in fp16 if r.name == "deepspeed-azure-175b-s512-g256")
    small = replace(
        r,
        model=replace(r.model, layers=2, hidden=256, heads=4, kv_heads=4, ffn=1024),
        cluster=replace(r.cluster, gpus=8),
        strategy=replace(r.strategy, dp=8, global_batch=16, microbatch=2),
    )
    res, _ = vp._simulated(small, vp.AS_PUBLISHED)
    assert built == [DType.f16] and res.step_time_s > 0


def test_megatron_h100_rows_are_untied_as_the_table_sizes_say() -> None:
    """The Megatron-LM README's table names each model by its size (1.7B ... 462B): the untied
    parameter count (embedding and output layer apart) is nearer that size than the tied one
    on every row, so the records set ``tied = false``."""
    rows = [r for r in RUNS if r.name.startswith("megatron-h100-")]
    assert len(rows) == 9
    for r in rows:
        size = float(r.name.removeprefix("megatron-h100-").removesuffix("b")) * 1e9
        counts: dict[bool, int] = {}
        for tied in (False, True):
            model = build_model(vp.zoo_model(replace(r.model, tied=tied)), batch=1, dtype=DType.bf16)
            counts[tied] = sum(w.type.numel for w in model.weights)
        assert not r.model.tied
        assert abs(counts[False] - size) < abs(counts[True] - size), (r.name, counts)


def test_figure_of_tokens_per_gpu() -> None:
    run = next(r for r in RUNS if r.published.metric == "tokens_per_gpu_s")
    tokens = run.strategy.global_batch * run.model.seq
    assert vp.figure_of(run, 2.0) == pytest.approx(tokens / 2.0 / run.cluster.gpus)


def test_error_is_a_throughput_error_for_every_metric() -> None:
    # twice as fast a step is +100 % whether the source publishes a rate or a step time
    for metric in vp.METRICS:
        run = next((r for r in RUNS if r.published.metric == metric), None)
        if run is None:
            continue
        # the step time whose figure is the published value (rates are work / step time), then half
        pub = run.published.value
        t = pub if metric == "seconds_per_step" else vp.figure_of(run, 1.0) / pub
        assert vp.throughput_error_pct(run, vp.figure_of(run, t)) == pytest.approx(0.0, abs=1e-9)
        assert vp.throughput_error_pct(run, vp.figure_of(run, t / 2)) == pytest.approx(100.0)


def test_fp8_runs_run_their_trainers_float8_recipe() -> None:
    """torchtitan's float8 (torchao's Float8Linear, dynamic scaling) is ``--precision fp8``,
    Transformer Engine's delayed scaling (llm-foundry's amp_fp8) ``fp8-delayed``."""
    fp8 = [r for r in RUNS if r.precision.startswith("fp8")]
    assert fp8
    for r in fp8:
        assert r.precision not in vp.unsupported(r), r.name
        want = "fp8" if "torchtitan" in r.trainer else "fp8-delayed"
        assert vp.PRECISIONS[r.precision] == want, r.name


def test_context_parallel_runs_map_onto_c() -> None:
    cp = [r for r in RUNS if r.strategy.cp > 1]
    assert cp
    for r in cp:
        assert vp.strategy_of(r.strategy).c == r.strategy.cp


def _one_run_text() -> str:
    text = vp.DATA.read_text()
    start = text.index("\n[[run]]\n") + 1
    return text[start : text.index("\n[[run]]\n", start)]


def _with_attention_kernel(text: str, kernel: str) -> str:
    text = re.sub(r"^attention_kernel = .*\n", "", text, flags=re.M)
    return re.sub(r"^(trainer = .*)$", rf'\1\nattention_kernel = "{kernel}"', text, count=1, flags=re.M)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: re.sub(r'^source = ".*"\n', "", t, flags=re.M), "missing field 'source'"),
        (lambda t: t.replace("[run.strategy]\n", "[run.strategy]\nmicrobatchsize = 2\n"), "unknown field"),
        (
            lambda t: re.sub(r"^global_batch = \d+", "global_batch = 7", t, flags=re.M),
            "whole number of microbatches",
        ),
        (lambda t: re.sub(r'^metric = ".*"', 'metric = "mfu_percent"', t, flags=re.M), "published.metric"),
        (lambda t: re.sub(r"^dp = \d+", "dp = 3", t, flags=re.M), "GPUs"),
        (
            lambda t: _with_attention_kernel(t, "triton"),
            "attention_kernel: expected one of fa2, cudnn, fa-triton, got 'triton'",
        ),
        (
            lambda t: t.replace("[run.published]\n", "[run.published]\nmemory_gib = 70.0\n"),
            "memory_gib needs",
        ),
        (
            lambda t: t.replace("[run.published]\n", '[run.published]\nmemory = "peak"\nmemory_gib = 7.0\n'),
            "memory_gib needs memory = one of allocator_reserved",
        ),
        (
            lambda t: t.replace(
                "[run.published]\n", '[run.published]\nmemory = "allocator_reserved"\nmemory_gib = "7"\n'
            ),
            "memory_gib: expected float",
        ),
        (
            # the first record (Megatron-LM's) overlaps its tensor-parallel collectives
            lambda t: re.sub(r"^(trainer = .*)$", r"\1\nlaunch_blocking = true", t, count=1, flags=re.M),
            "launch_blocking runs one kernel at a time",
        ),
    ],
)
def test_loader_names_a_bad_record(tmp_path: Path, edit: object, message: str) -> None:
    bad = tmp_path / "runs.toml"
    bad.write_text(edit(_one_run_text()))  # type: ignore[operator]
    with pytest.raises(vp.RunsError, match=re.escape(message)) as e:
        vp.load_runs(bad)
    assert "run[0]" in str(e.value)


def test_only_selects_by_name_and_prefix_and_rejects_unknown() -> None:
    first = RUNS[0].name
    assert [r.name for r in vp.select(RUNS, [first], False)] == [first]
    prefix = first.split("-")[0] + "-*"
    assert all(r.name.startswith(prefix[:-1]) for r in vp.select(RUNS, [prefix], False))
    with pytest.raises(vp.RunsError, match="no run named"):
        vp.select(RUNS, ["no-such-run"], False)


def test_loader_accepts_every_published_attention_kernel(tmp_path: Path) -> None:
    from distir.hardware.attention import KERNELS

    for kernel in KERNELS:
        text = _with_attention_kernel(_one_run_text(), kernel)
        path = tmp_path / f"{kernel}.toml"
        path.write_text(text)
        assert [r.attention_kernel for r in vp.load_runs(path)] == [kernel]


def test_llm_foundry_triton_rows_run_flash_attention_in_triton_without_unpadding() -> None:
    # the rows whose table came from submit_benchmarks.py's --attn_impl default 'triton'
    # (llm-foundry b2a43a147, mosaicml/examples 9fa3ceb9a); the large-scale H100 rows
    # (5e85bd62d) pass --attn_impl flash
    mosaic = [r for r in RUNS if r.name.startswith("mosaic-")]
    flash = {"mosaic-h100-1b-s2048-g128", "mosaic-h100-3b-s2048-g128"}
    assert flash <= {r.name for r in mosaic}
    for r in mosaic:
        want = ("fa2", True) if r.name in flash else ("fa-triton", False)
        assert (r.attention_kernel, r.model.unpad) == want, r.name


def test_the_trainers_that_fuse_the_qkv_projection_run_it_fused() -> None:
    # Megatron-LM's linear_qkv / query_key_value (Megatron-DeepSpeed's and NeMo's Megatron-Core model
    # too) and llm-foundry's Wqkv are one GEMM; torchtitan's Llama has three (wq, wk, wv);
    # metaseq's ModelParallelMultiheadAttention combines them too (combine_qkv_proj: qkv_proj)
    fusing = ("Megatron-LM", "Megatron-DeepSpeed", "llm-foundry", "NeMo", "metaseq")
    for r in RUNS:
        want = "fused" if r.trainer.startswith(fusing) else "split"
        assert r.model.qkv == want, r.name
        assert (",qkv=fused" in vp.zoo_model(r.model)) == (want == "fused"), r.name


TITAN = [r for r in SUPPORTED if r.trainer.startswith("torchtitan")]


def test_torchtitan_runs_name_pytorch_sdpa_flash_backend() -> None:
    # torchtitan calls F.scaled_dot_product_attention; at the pages' torch versions its flash
    # backend (FlashAttention-2) runs on H100 (cuDNN opt-in, pytorch/pytorch#138522; torchtitan
    # 820504e puts cuDNN first on compute capability 10.0 only)
    assert len(TITAN) >= 6
    assert {r.attention_kernel for r in TITAN} == {"fa2"}


def test_torchtitans_compiled_runs_take_inductors_kernels() -> None:
    """A torchtitan row run with ``torch.compile`` takes Inductor's default kernels (no GEMM
    epilogue) and the forms its compiled block still runs (RoPE in fp32 around ATen's complex
    product, ``repeat_kv``'s copy, one ``F.silu``); one without takes eager PyTorch's."""
    for r in TITAN:
        compiled = "torch.compile" in r.trainer
        assert r.kernels == ("inductor" if compiled else "eager"), r.name
        assert (r.model.rope, r.model.silu, r.model.kv) == ("fp32", "fused", "copy"), r.name
        assert r.model.norm == ("fused" if compiled else "composite"), r.name


def test_grand_teton_cluster_has_the_torchtitan_pages_hardware() -> None:
    # the pages' "Hardware" section: 8 H100 per host, 96GB HBM2e at 2.4 TB/s, 400 Gb/s per GPU,
    # 500 W
    for run in (r for r in TITAN if "grand-teton" in r.cluster.spec):
        cluster = vp.cluster_of(run.cluster)
        node = cluster.nodes[0]
        assert node.devices_per_node == 8
        assert node.device.memory_bandwidth == pytest.approx(2.4e12)
        assert node.device.memory_bytes == 96 * 2**30
        assert node.inter.bandwidth / node.nics == pytest.approx(400e9 / 8)
        power = node.device.power  # "the default 500W power limit, although ... up to 700W TDP"
        assert power is not None and (power.limit_w, power.reference_w) == (500, 700)


def test_trainys_h200_rows_run_the_pages_hardware_and_float8_gathers() -> None:
    """Trainy's page (llama3-8b_h200_202506_trainy-whitefiber.md): 8 H200 per host (141 GiB of
    HBM3e at 4.8 TB/s, the H100's tensor peaks), 400 Gb/s per GPU, at 4 and 8 hosts, each row
    with the command's float8 all-gather, local batch 2 and compiled blocks."""
    rows = [r for r in RUNS if r.name.startswith("trainy-h200-")]
    assert sorted(r.cluster.gpus for r in rows) == [32, 64]
    for r in rows:
        node = vp.cluster_of(r.cluster).nodes[0]
        assert node.devices_per_node == 8 and node.device.memory_bytes == 141 * 2**30
        assert node.device.memory_bandwidth == pytest.approx(4.8e12)
        assert node.device.bf16 == pytest.approx(989.4e12, rel=1e-3)
        assert node.inter.bandwidth / node.nics == pytest.approx(400e9 / 8)
        assert r.float8_gather and r.gather_cast and r.precision == "fp8" and r.kernels == "inductor"
        assert r.strategy.microbatch == 2 and r.strategy.global_batch == 2 * r.cluster.gpus
        assert r.strategy.recompute == "ops" and r.strategy.zero == 3


def test_published_memory_selects_the_allocator_walk() -> None:
    with_memory = [r for r in RUNS if r.published.memory_gib is not None]
    assert with_memory and all(r.published.memory == "allocator_reserved" for r in with_memory)
    assert all(r.trainer.startswith("torchtitan") for r in with_memory)


def test_every_row_of_torchtitans_december_page_in_the_records_carries_its_memory() -> None:
    """The page (llama3_h100_202412_torchtitan.md) publishes Memory(GiB) beside every TPS/GPU
    in its six tables (3 + 4 + 3 + 2 + 2 + 4 rows): each row is a record stating both, the
    figure quoted in its ``where``."""
    page = [r for r in RUNS if r.source.endswith("llama3_h100_202412_torchtitan.md")]
    assert len(page) == 18
    for r in page:
        assert r.published.memory == "allocator_reserved" and r.published.memory_gib is not None
        assert f"{r.published.memory_gib} GiB" in r.where
    memory = {r.name: r.published.memory_gib for r in page}
    assert memory["titan-8b-cp2-fp8-g8"] == 84.2
    assert memory["titan-70b-fsdp32-tp8-fp8-g256"] == 71.9
    assert memory["titan-405b-3d-interleaved-fp8-g512"] == 72.7


def test_memory_error_compares_the_reserved_prediction() -> None:
    run = next(r for r in RUNS if r.name == "titan-8b-fsdp-g8")
    p = vp.Prediction(1.0, 1.0, True, 80.0, 96.0, "s", 0.0, reserved_gib=run.published.memory_gib * 1.1)
    assert vp.memory_error_pct(vp.Row(run, p, 0.0, "")) == pytest.approx(10.0)
    assert vp.memory_error_pct(vp.Row(run, p._replace(reserved_gib=None), 0.0, "")) is None


def test_memory_summary_names_the_rows_predicted_far_under() -> None:
    runs = [r for r in RUNS if r.published.memory_gib is not None][:3]

    def row(run: object, ratio: float) -> object:
        pub = run.published.memory_gib  # type: ignore[attr-defined]
        return vp.Row(run, vp.Prediction(1.0, 1.0, True, 1.0, 96.0, "s", 0.0, pub * ratio), 0.0, "")  # type: ignore[arg-type]

    (line,) = vp.memory_summary([row(runs[0], 0.9), row(runs[1], 1.02), row(runs[2], 0.97)])
    assert "3 runs: predicted -10.0…+2.0% (median -3.0%)" in line
    assert line.endswith(f"1 under by more than 5% ({runs[0].name})")
    assert vp.memory_summary([]) == []


def test_gemm_share_walks_the_plan_as_the_op_trace_times_it() -> None:
    """``--interference persistent``: the GEMMs' share of GPU 0's kernel time, summed over the
    plan's bodies, is the share the op-detail trace shows; the run then predicts a slower step."""
    from distir.ops.registry import REGISTRY

    run = next(r for r in RUNS if r.name == "mosaic-h100-7b-s2048-g8")
    res, _ = vp._simulated(run, vp.AS_PUBLISHED, trace=True, trace_detail="op")
    total = gemm = 0.0
    for s in res.trace_detail().slices:
        op = s.args.get("op")
        if s.slot == 0 and not s.comm and op is not None:
            total += s.end - s.start
            gemm += (s.end - s.start) if REGISTRY[op].gemm is not None else 0.0
    share = vp.gemm_share(res)
    assert 0.3 < share < 0.9 and share == pytest.approx(gemm / total, rel=1e-9)
    # GPU 0's trace alone (what ``--interference persistent`` takes) gives the same share
    alone, _ = vp._simulated(run, vp.AS_PUBLISHED, trace=True, trace_detail="op", trace_gpus=frozenset({0}))
    assert vp.gemm_share(alone) == pytest.approx(share, rel=1e-12)
    slow, _ = vp._simulated(run, vp.Variant(persistent=True))
    fast, _ = vp._simulated(run, vp.AS_PUBLISHED)
    assert slow.step_time_s > fast.step_time_s


def test_only_bloom_launches_its_kernels_synchronously() -> None:
    # tr11-176B-ml.slurm exports CUDA_LAUNCH_BLOCKING=1; no other record's launcher does
    assert [r.name for r in RUNS if r.launch_blocking] == ["bloom-176b"]


def test_plot_draws_every_predicted_row_by_source(tmp_path: Path) -> None:
    """``--plot``: a PNG of the errors by source beside the memory panel; the unsupported rows
    are left out and the series are the records' name prefixes."""
    mem = next(r for r in RUNS if r.published.memory_gib is not None)
    other = next(r for r in RUNS if vp.source_of(r) != vp.source_of(mem))
    p = vp.Prediction(1.0, 1.0, True, 80.0, 96.0, "s", 0.0, reserved_gib=mem.published.memory_gib)
    skipped = vp.Row(other, None, None, "unsupported: x")
    rows = [vp.Row(mem, p, 12.0, ""), vp.Row(other, p, -30.0, ""), skipped]
    out = tmp_path / "errors.png"
    vp.plot_png(rows, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {vp.source_of(r) for r in RUNS} >= {"megatron", "mosaic", "titan"}


def test_plot_path_is_checked_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert vp.main(["--only", "megatron-h100-1.7b", "--plot", str(tmp_path)]) == 2
    assert "--plot" in capsys.readouterr().err


NEMO = [r for r in RUNS if r.name.startswith("nemo-") and "performance_summary" in r.source]
NEMO_LONG = [r for r in RUNS if r.name.startswith("nemo-long-")]


def test_nemo_rows_are_the_whole_pretraining_table() -> None:
    """NeMo 24.07's pre-training table has 12 rows, all FP8 (Transformer Engine's delayed scaling)
    on DGX-H100, all predicted; the three Nemotron rows are the zoo's nemotron family (LayerNorm1p,
    squared-ReLU MLP, partial RoPE)."""
    assert len(NEMO) == 12
    for r in NEMO:
        assert r.precision == "fp8-delayed" and r.cluster.spec == "h100", r.name
        assert not vp.unsupported(r), r.name
        # the launcher's env_vars set NVTE_FUSED_ATTN: 0: Transformer Engine runs flash-attn
        assert r.attention_kernel == "fa2", r.name
        assert (r.model.family == "nemotron") == ("nemotron" in r.name), r.name
        s = r.strategy
        assert (s.schedule == "interleaved") == (s.virtual_stages > 1), r.name
        # Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by (128) · TP
        assert r.model.vocab % (128 * s.tp) == 0, r.name
        # userbuffers overlap needs sequence parallelism
        assert not r.tp_comm_overlap or s.sequence_parallel, r.name


def test_nemos_tables_count_megatrons_model_flops() -> None:
    """NeMo 24.07's table gives tokens/s and model TFLOP/s per GPU for each row: Megatron's FLOPs
    formula (non-causal attention, the logit layer) turns the one into the other, which is what
    lets the long-sequence table's TFLOP/s figures be records with ``flops_formula = megatron``."""
    for r in NEMO:
        published = float(re.search(r"Model TFLOP/s/GPU (\d+)", r.published.also).group(1))  # type: ignore[union-attr]
        derived = r.published.value * vp.megatron_flops(r.model, 1) / r.model.seq / 1e12
        assert abs(derived / published - 1) < 0.002, (r.name, derived, published)


def test_nemo_long_sequence_rows_are_the_whole_h100_table() -> None:
    """NeMo's long-sequence table (Llama 2 7B, FP8, DGX-H100): nine rows from 4K to 1M tokens, one
    GPU per 1K tokens, 4M tokens a step, the context-parallel ones on Transformer Engine's ring
    (distir's default ``ring_form``) with FlashAttention-2 as NeMo's launcher runs it, sequence
    parallelism with every TP > 1."""
    assert [r.model.seq for r in NEMO_LONG] == [4096 * 2**i for i in range(9)]
    for r in NEMO_LONG:
        s = r.strategy
        assert r.cluster.gpus == r.model.seq // 1024 == s.dp * s.tp * s.pp * s.cp, r.name
        assert s.global_batch * r.model.seq == 4 * 2**20, r.name
        assert r.published.metric == "tflops_per_gpu" and r.published.flops_formula == "megatron", r.name
        assert r.ring_form == "p2p" and r.precision == "fp8-delayed" and not vp.unsupported(r), r.name
        assert r.attention_kernel == "fa2", r.name
        assert s.sequence_parallel == (s.tp > 1) and r.model.vocab % (128 * s.tp) == 0, r.name


@pytest.mark.parametrize("run", [r for r in NEMO + NEMO_LONG if not vp.unsupported(r)], ids=lambda r: r.name)
def test_nemo_models_are_the_size_their_names_say(run: object) -> None:
    """GPT3-5B ... LLAMA3-70B: the record's model has within 7% of the parameters its table name
    gives (GPT-3 tied, at the padded vocabulary; Llama 2 7B has 6.74B, Nemotron 8B 8.54B: its
    untied 256,000-token embeddings are 2.1B)."""
    size = float(re.search(r"-(\d+)b-", run.name).group(1)) * 1e9  # type: ignore[union-attr,attr-defined]
    model = build_model(vp.zoo_model(run.model), batch=1, dtype=DType.bf16)  # type: ignore[attr-defined]
    count = sum(w.type.numel for w in model.weights)
    assert abs(count / size - 1) < 0.07, (run.name, count)  # type: ignore[attr-defined]
