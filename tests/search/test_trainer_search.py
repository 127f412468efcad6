"""``distir search --trainer``: the space holds what the trainer runs by default, the exact phase
simulates each plan as ``distir simulate --trainer`` does, and the screen counts the model state
as the trainer holds it (fp32 gradient sums, FSDP's shards, FSDP2's kept root), so its peak
follows the exact one."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.autodiff.precision import MIXED
from distir.cli import app
from distir.hardware.cluster import parse_cluster
from distir.ir.types import DType
from distir.parallel.strategy import parse_strategy
from distir.parallel.trainers import trainer_allows
from distir.search.profile import trainer_form
from distir.search.run import SearchRequest, resolve_layout, search
from distir.search.space import Pins, SpaceError
from distir.search.stage_costs import StateForm, new_tables, pipelining_kept

LLAMA = "llama:layers=4,hidden=512,heads=8,kv_heads=2,ffn=1408,vocab=4096,seq=512"
# whole query groups for every tensor-parallel degree of a node (t = 1…8)
LLAMA_MHA = "llama:layers=4,hidden=512,heads=8,kv_heads=8,ffn=1408,vocab=4096,seq=512"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _request(trainer: str, model: str = LLAMA, **kw: object) -> SearchRequest:
    return SearchRequest(
        model=model, cluster="dgx-a100", batch=64, dtype="bf16", precision="mixed", trainer=trainer, **kw
    )  # type: ignore[arg-type]


def test_the_trainer_form_names_its_kernels_and_its_model_by_tensor_parallelism() -> None:
    h100 = parse_cluster("h100")
    spec, form = trainer_form("llama3-8b", "torchtitan", h100)
    assert form.kernels == "eager" and form.spec_tp is not None
    assert spec.config.loss == "torch" and form.spec_tp.config.loss == "parallel"  # type: ignore[union-attr]
    assert form.spec_at(spec, 1) is spec and form.spec_at(spec, 8) is form.spec_tp
    assert form.policy("ops") == "ops-eager" and form.policy("full") == "full"
    spec, form = trainer_form("llama3-8b", "megatron", h100)
    assert form.kernels == "fused" and form.attention_kernel == "cudnn" and form.spec_tp is None
    assert spec.config.qkv == "fused"  # type: ignore[union-attr]
    spec, form = trainer_form("llama3-8b", "distir", h100)
    assert form.kernels == "fused" and form.attention_kernel == "fa2" and form.spec_tp is None
    assert spec.config.qkv != "fused"  # type: ignore[union-attr]


def test_the_trainer_is_part_of_the_store_key() -> None:
    assert _request("torchtitan").key_parts() != _request("megatron").key_parts()


def test_the_state_form_counts_fp32_gradients_and_fsdp_shards() -> None:
    """Per half weight byte: fp32 gradient sums hold 2 (whole, or the shard under ZeRO-3);
    FSDP's gather_cast keeps no half shard, only the fp32 master and Adam's two moments."""
    z1, z3 = parse_strategy("d8.k4.z1"), parse_strategy("d8.k4.z3")
    plain = new_tables(z1, 2, True, 2, True)
    wide = new_tables(z1, 2, True, 2, True, StateForm(fp32_grads=True))
    assert (plain.grad_f, wide.grad_f) == (1.0, 2.0)
    assert new_tables(z1, 2, True, 2, False, StateForm(fp32_grads=True)).grad_f == 1.0  # pure: no masters
    fsdp = new_tables(z3, 2, True, 2, True, StateForm(fp32_grads=True, no_half_shard=True, root_kept=True))
    assert fsdp.static_f == pytest.approx(6 / 8) and fsdp.grad_f == pytest.approx(2 / 8)
    assert new_tables(z3, 2, True, 2, True).static_f == pytest.approx(1 / 8 + 6 / 8)
    assert fsdp.root_kept and not new_tables(parse_strategy("d4.p2.k4.z3"), 2, True, 2, True).root_kept
    early = new_tables(parse_strategy("d4.p2.k4.z2"), 2, True, 2, True, StateForm(early_gather=True))
    assert early.static_f == pytest.approx(1 + 1 / 4 + 6 / 4)  # the half shard beside the whole copy
    # cp ranks shard as data-parallel ones (FSDP2 over dp_shard_cp): one dp shard, c = 4, alike
    cp = new_tables(parse_strategy("d1.c4.p2.k4.z2"), 2, True, 2, True, StateForm(early_gather=True))
    assert cp.static_f == pytest.approx(early.static_f)


@pytest.mark.slow
def test_a_torchtitan_search_holds_only_what_torchtitan_runs() -> None:
    o = search(_request("torchtitan", top=3))
    assert o.screened and o.results
    for e in o.screened:
        s = e.strategy
        assert trainer_allows("torchtitan", s, MIXED, DType.bf16)
        assert s.d * s.c == 1 or s.zero >= 2  # mixed precision through FSDP2 only
        assert not (s.zero == 3 and s.p > 1)
    assert {r["trainer"] for r in o.results} == {"torchtitan"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("trainer", "cluster", "pins"),
    [("megatron", "dgx-a100", Pins(dp=4)), ("megatron", "h100", Pins(schedule="interleaved", pp=2))],
)
def test_the_exact_phase_simulates_as_simulate_trainer_does(trainer: str, cluster: str, pins: Pins) -> None:
    """The search's figures of its plans are those ``distir simulate --trainer`` gives them
    (another code path: the CLI builds the trainer's model string and switches itself), the
    program order included (on Hopper Megatron-LM's chunk times are cuDNN attention's)."""
    o = search(SearchRequest(model=LLAMA, cluster=cluster, batch=64, dtype="bf16", precision="mixed",
                             trainer=trainer, top=2, pins=pins))  # fmt: skip
    for row in o.results:
        args = ["simulate", "--model", LLAMA, "--strategy", row["strategy"], "--cluster", cluster]
        args += ["--batch", "64", "--dtype", "bf16", "--precision", "mixed", "--trainer", trainer, "--json"]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        sim = json.loads(res.stdout)
        assert sim["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-12), row["strategy"]
        assert max(sim["peak_memory_bytes"].values()) == pytest.approx(row["peak_memory_bytes"], rel=1e-12)


def test_the_found_layout_is_the_trainers_models() -> None:
    """``--tp-layout auto`` under a trainer finds the placements of the model the trainer runs
    (Megatron-LM's one QKV GEMM), not of the model string's."""
    req = resolve_layout(_request("megatron", tp_layout="auto"))
    names = {name for name, _ in req.tp_found}
    assert {"wqkv_0", "wo_0"} <= names and "wq_0" not in names, names


def test_a_trainer_that_runs_none_of_the_space_is_one_line() -> None:
    req = SearchRequest(
        model=LLAMA, cluster="dgx-a100", batch=64, dtype="bf16", precision="pure", trainer="megatron"
    )
    with pytest.raises(
        SpaceError, match=r"--trainer megatron runs none of the strategies searched: .*--precision mixed"
    ):
        search(req)
    res = runner.invoke(app, ["search", "--model", LLAMA, "--cluster", "dgx-a100", "--trainer", "fsdp"])
    assert res.exit_code == 2 and "--trainer must be one of" in res.output
    res = runner.invoke(
        app, ["search", "--model", LLAMA, "--cluster", "dgx-a100", "--trainer", "megatron", "--infer"]
    )
    assert res.exit_code == 2 and "an inference search takes none" in res.output


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["megatron", "deepspeed", "torchtitan"])
def test_screened_peak_follows_the_exact_peak_under_each_trainer(trainer: str) -> None:
    """Issue 17's bounds (median |error| ≤ 5%, none more than 15% under) with the trainer's
    state: ZeRO-3 pinned, so FSDP's shards and kept root (torchtitan) and the fp32 sums under
    ZeRO-3 are screened."""
    for pins in (Pins(max_k=8), Pins(zero=3, max_k=8)):
        o = search(_request(trainer, model=LLAMA_MHA, top=6, pins=pins))
        screened = {str(e.strategy): e.peak_memory_bytes for e in o.screened}
        runtime = o.cluster.device_spec(0).runtime
        ratios = [
            screened[r["strategy"]] / runtime.tensor_capacity(r["peak_memory_bytes"]) for r in o.results
        ]
        assert len(ratios) >= 3
        assert statistics.median([abs(x - 1) for x in ratios]) <= 0.05, (pins, ratios)
        assert min(ratios) >= 0.85, (pins, ratios)


@pytest.mark.slow
def test_the_cli_searches_as_the_trainer_and_exports_to_it(tmp_path: Path) -> None:
    args = [
        "search",
        "--model",
        LLAMA,
        "--cluster",
        "dgx-a100",
        "--batch",
        "64",
        "--top",
        "2",
        "--workers",
        "1",
    ]
    args += ["--dp", "8", "--trainer", "torchtitan", "--store", str(tmp_path / "s.sqlite"), "--json"]
    res = runner.invoke(app, [*args, "--export", "torchtitan"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["trainer"] == "torchtitan" and out["results"][0]["trainer"] == "torchtitan"
    assert out["results"][0]["zero"] >= 2 and "data_parallel_shard_degree = 8" in out["export"]["text"]
    for target in ("megatron", "fsdp"):
        res = runner.invoke(app, [*args, "--export", target])
        assert res.exit_code == 2 and f"export to torchtitan, or search with --trainer {target}" in res.output


def test_what_pipelining_keeps_per_stage() -> None:
    """torch.distributed.pipelining keeps, per microbatch, each stage's received activations
    (and their gradients) and received gradients, and the last stage's logits (merged at the
    end); ``every`` keeps each stage's outputs too."""
    s = parse_strategy("d1.p2.k4")
    out = [1.0, 2.0, 3.0, 4.0, 5.0, 0.0]  # embed, block, block | block, head (logits 5), loss
    bounds = [0, 3, 6]
    (first, merge0), (last, merge1) = pipelining_kept(s, "last", out, bounds)
    assert (first, merge0) == (4 * 3.0, 0.0)  # its output's gradients
    assert (last, merge1) == (4 * (2 * 3.0 + 5.0), 4 * 5.0)  # activations in, their gradients, logits
    assert pipelining_kept(s, "every", out, bounds)[0] == (4 * (3.0 + 3.0), 0.0)
