"""The PyTorch file (``distir.export.fsdp``): it compiles for every plan, names torch's APIs, and
runs — mesh, TP, recomputation, FSDP2, a pipeline schedule — on one CPU process (gloo)."""

from __future__ import annotations

import importlib.util
import json
import py_compile
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from distir.export import ExportError, export, make_plan

PLANS = {
    "pure DP": "d8.t1.p1.k1.1f1b",
    "FSDP": "d8.t1.p1.k2.1f1b.z3",
    "TP+sp": "d2.t4.sp.p1.k1.1f1b.rsel",
    "PP interleaved": "d1.t1.p4.k8.interleaved.v2.rops",
    "hybrid 3D": "d2.t2.sp.p2.k4.zb1.z1.rfull.L15-17",
}


def _write(tmp_path: Path, strategy: str, name: str = "plan") -> Path:
    e = export(make_plan("llama3-8b", strategy, 64, cluster="dgx-a100:2"), "fsdp")
    path = tmp_path / f"{name}.py"
    path.write_text(e.text)
    return path


@pytest.mark.parametrize("strategy", PLANS.values(), ids=PLANS.keys())
def test_the_file_compiles_and_states_the_plan(tmp_path: Path, strategy: str) -> None:
    path = _write(tmp_path, strategy)
    py_compile.compile(str(path), doraise=True)
    text = path.read_text()
    s = make_plan("llama3-8b", strategy, 64).strategy
    assert f"DP, TP, PP, V = {s.d}, {s.t}, {s.p}, {s.v}" in text
    assert f"MICROBATCHES = {s.k} " in text
    assert f"MICROBATCH_SIZE = {64 // (s.d * s.k)}" in text
    assert f"SEQUENCE_PARALLEL = {s.sp}" in text
    assert f"ZERO = {s.zero} " in text


def test_schedules_are_torch_pipelining_classes() -> None:
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    from distir.export.fsdp import SCHEDULES

    for cls in SCHEDULES.values():
        assert hasattr(pipelining, cls), cls


def test_zero1_is_exported_as_zero2_with_a_warning() -> None:
    e = export(make_plan("llama3-8b", "d8.t1.p1.k1.1f1b.z1", 64), "fsdp")
    assert any("ZeRO-1" in w for w in e.warnings)


def test_tensor_parallelism_of_a_model_without_transformer_modules_is_refused() -> None:
    with pytest.raises(ExportError, match="tensor-parallel plan"):
        export(make_plan("mlp:layers=4,hidden=64", "d1.t2.p1.k1.1f1b", 8), "fsdp")


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gloo() -> object:
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield torch
    dist.destroy_process_group()


def _chunk(torch: ModuleType, dim: int, n_blocks: int, gated: bool) -> object:
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x: object) -> object:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
            return self.wo(torch.softmax(q @ k.transpose(1, 2) / dim**0.5, dim=-1) @ v)

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w2 = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(2 * dim, dim, bias=False)
            if gated:
                self.w3 = nn.Linear(dim, 2 * dim, bias=False)

        def forward(self, x: object) -> object:
            h = torch.nn.functional.silu(self.w1(x))
            return self.w2(h * self.w3(x) if gated else h)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attention, self.feed_forward = Attention(), FeedForward()

        def forward(self, x: object) -> object:
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.ffn_norm(x))

    class Chunk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({str(i): Block() for i in range(n_blocks)})

        def forward(self, x: object) -> object:
            for block in self.layers.values():
                x = block(x)
            return x

    return Chunk()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", PLANS.values(), ids=PLANS.keys())
def test_the_file_runs_a_step_on_one_gloo_process(tmp_path: Path, gloo: ModuleType, strategy: str) -> None:
    torch = gloo
    mod = _load(_write(tmp_path, strategy, "plan_" + strategy.replace(".", "_").replace("-", "_")))
    mesh = mod.build_mesh("cpu", pp=1, dp=1, tp=1)
    chunks = mod.local_chunks(mesh)
    assert chunks == list(range(mod.V))  # one stage holds every chunk
    torch.manual_seed(0)
    model = {c: _chunk(torch, 16, 2, mod.GATED_MLP) for c in chunks}
    mod.parallelize(model, mesh)
    n = mod.MICROBATCHES
    schedule = mod.build_schedule(model, mesh, lambda y, t: ((y - t) ** 2).mean(), torch.device("cpu"))
    x, target = torch.randn(n, 4, 16), torch.randn(n, 4, 16)
    losses: list[object] = []
    schedule.step(x, target=target, losses=losses)
    assert len(losses) == n
    grads = [p.grad for c in model.values() for p in c.parameters()]
    assert all(g is not None for g in grads)


def test_context_parallelism_is_refused() -> None:
    with pytest.raises(ExportError, match="context parallelism"):
        export(make_plan("llama3-8b", "d2.t1.c2.p1.k1.1f1b", 64), "fsdp")


FP8_PLAN = "d2.t4.sp.p2.k4.1f1b.z1"


def test_fp8_converts_the_chunks_with_torchao_and_compiles_the_blocks(
    tmp_path: Path, golden: Callable[[str, str], None]
) -> None:
    e = export(make_plan("llama3-8b", FP8_PLAN, 64, precision="fp8", cluster="h100:2"), "fsdp")
    golden("fsdp-fp8.py.golden", e.text)
    path = tmp_path / "fp8.py"
    path.write_text(e.text)
    py_compile.compile(str(path), doraise=True)
    assert "from torchao.float8 import Float8LinearConfig, convert_to_float8_training" in e.text
    assert e.text.count("Float8ColwiseParallel()") == 5 and "PrepareFloat8ModuleInput(" in e.text
    assert 'module_filter_fn=lambda mod, fqn: fqn != "output"' in e.text  # the head stays bf16


def test_fp8_delayed_is_refused_since_torchao_scales_dynamically_only() -> None:
    with pytest.raises(ExportError, match="cannot express fp8-delayed"):
        export(make_plan("llama3-8b", "d8.t1.p1.k1.1f1b", 64, precision="fp8-delayed"), "fsdp")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [FP8_PLAN, "d1.t2.p2.k4.interleaved.v2.rfull"])
def test_the_fp8_file_runs_a_step_with_torchao(
    tmp_path: Path, gloo: ModuleType, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """torchao's float8 emulated (a CPU has no float8 GEMM), torch.compile a no-op (no compiler)."""
    float8 = pytest.importorskip("torchao.float8")
    torch = gloo
    e = export(make_plan("llama3-8b", strategy, 64, precision="fp8", cluster="h100:2"), "fsdp")
    path = tmp_path / ("fp8_" + strategy.replace(".", "_").replace("-", "_") + ".py")
    path.write_text(e.text)
    mod = _load(path)
    monkeypatch.setattr(mod, "FLOAT8", float8.Float8LinearConfig(emulate=True))
    monkeypatch.setattr(torch, "compile", lambda m, **kw: m)
    mesh = mod.build_mesh("cpu", pp=1, dp=1, tp=1)
    torch.manual_seed(0)
    model = {c: _chunk(torch, 32, 2, mod.GATED_MLP) for c in mod.local_chunks(mesh)}
    mod.parallelize(model, mesh)
    assert type(model[0].layers["0"].attention.wq).__name__ == "Float8Linear"
    n = mod.MICROBATCHES
    schedule = mod.build_schedule(
        model, mesh, lambda y, t: ((y.float() - t) ** 2).mean(), torch.device("cpu")
    )
    losses: list[object] = []
    x, target = torch.randn(n, 16, 32), torch.randn(n, 16, 32)
    schedule.step(x, target=target, losses=losses)
    assert len(losses) == n
    assert all(p.grad is not None for c in model.values() for p in c.parameters())


@pytest.mark.slow
def test_a_hugging_face_llama_is_parallelized_by_its_own_names(tmp_path: Path, gloo: ModuleType) -> None:
    """For an ``hf:`` Llama config the file names Hugging Face's modules (q_proj, gate_proj, ...,
    its attention's input by keyword): on one gloo process, tensor and sequence parallelism and
    FSDP2 apply to the transformers model itself (``chunk.layers`` = ``model.model.layers``) and
    it trains a step."""
    torch = gloo
    transformers = pytest.importorskip("transformers")
    config = Path(__file__).parents[1] / "frontends" / "configs" / "llama-tiny.json"
    plan = make_plan(f"hf:{config}", "d1.t2.sp.p1.k1.1f1b", 2, cluster="dgx-a100", dtype="f32")
    e = export(plan, "fsdp")
    assert '"self_attn.q_proj"' in e.text and '"mlp.gate_proj"' in e.text and "attention.wq" not in e.text
    path = tmp_path / "hf_plan.py"
    path.write_text(e.text)
    mod = _load(path)
    torch.manual_seed(0)
    raw = json.loads(config.read_text())
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**raw, attn_implementation="sdpa"))
    mesh = mod.build_mesh("cpu", pp=1, dp=1, tp=1)
    assert set(mod.tp_plan()) <= {name for name, _ in model.model.layers[0].named_modules()}
    mod.parallelize({0: model.model}, mesh)
    ids = torch.randint(0, 32, (2, 8))
    model(input_ids=ids).logits.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in model.model.layers.parameters())
