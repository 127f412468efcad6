"""A Mistral export (``torch.onnx.export(dynamo=True)`` of transformers' MistralForCausalLM) as
a model: its written-out RMSNorm, SiLU and rotary embedding fuse as ``RMSNormalization``,
``Silu`` and ``Rope``, GQA's ``repeat_kv`` is read by the fused attention as the kv heads hold
it, and the sliding window's banded mask fuses as ``Attention(window=W)``; the result matches
onnxruntime, and replicas, microbatches, tensor parallelism and pipeline stages equal the
sequential step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from distir.frontends.files import load_file
from distir.ir.ops import Op
from distir.parallel.strategy import parse_strategy

from .onnx_exports import export_logits, exporting, nudge_norms

WINDOW = 4  # under the 8 positions imported, so the mask is a band, not the causal triangle


def _export_mistral(path: Path) -> Path:
    transformers = exporting()
    cfg = transformers.MistralConfig(
        num_hidden_layers=3,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        vocab_size=50,
        sliding_window=WINDOW,
        attn_implementation="sdpa",
    )
    lm = transformers.MistralForCausalLM(cfg).eval()
    nudge_norms(lm, "norm")
    return export_logits(path, lm, dynamic=True, max_seq=64)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _export_mistral(tmp_path_factory.mktemp("onnx") / "mistral.onnx")


@pytest.mark.xdist_group("onnx-mistral")
@pytest.mark.slow
def test_a_mistral_export_imports_with_windowed_attention_and_matches_onnxruntime(mistral: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    import distir
    from distir.frontends.onnx_import import import_onnx
    from distir.interp.reference import run_reference

    imp = import_onnx(str(mistral), dims={"seq": 8}, batch=4)
    # the rotary embedding fused (its frequencies an attribute, no longer a weight), so no value
    # passes from @pre to the blocks but the activations
    assert imp.layers == ("pre", "block", "block", "block", "post"), imp.note
    assert imp.shared == () and all("inv_freq" not in w.name for w in imp.weights)
    ops = [i for f in imp.module.functions for i in f.body if isinstance(i, Op)]
    attention = [op for op in ops if op.name == "Attention"]
    assert len(attention) == 1 and attention[0].attrs.get("window") == WINDOW  # in @block, called 3 times
    names = {op.name for op in ops}
    assert not {"Softmax", "IsNaN", "Expand", "Reciprocal", "Pow", "Sin", "Cos", "Neg", "Sigmoid"} & names
    assert {"Rope", "RMSNormalization", "Silu"} <= names  # RoPE, RMSNorm, SiLU and repeat_kv fused
    typed = [i for f in distir.check(imp.module).functions for i in f.body if isinstance(i, Op)]
    (fused,) = [op for op in typed if op.name == "Attention"]
    heads = [v.type.shape[2] for v in fused.inputs]  # type: ignore[union-attr]
    assert heads == [4, 2, 2]  # the keys and values as the 2 kv heads hold them (GQA), not repeated
    ids = np.random.default_rng(0).integers(0, 50, (4, 8))
    got = run_reference(distir.check(imp.module), imp.arguments({"input_ids": ids}))
    sess = ort.InferenceSession(mistral.read_bytes(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(
        np.asarray(got[0]), sess.run(None, {"input_ids": ids})[0], rtol=1e-4, atol=1e-5
    )


@pytest.mark.xdist_group("onnx-mistral")
@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy",
    [
        "d2.t1.p1.k2.1f1b",
        "d2.t2.p1.k1.1f1b",
        "d1.t1.p2.k2.1f1b",
        "d1.t2.p2.k2.1f1b",
        "d1.t1.p3.k4.1f1b",
        "d2.t2.sp.p1.k2.1f1b",
        "d1.t2.sp.p2.k2.1f1b",
    ],
)
def test_a_mistral_export_split_over_replicas_and_microbatches_equals_the_sequential_step(
    mistral: Path, strategy: str
) -> None:
    """Its positions every device computes from constants are replicated where a sharded op
    needs them (``Redistribute(x, like)``), its weights are split as their modules' names say,
    and sequence parallelism splits its activations along dim 1."""
    from distir.parallel.check import check_against_sequential

    model = load_file(f"{mistral}:seq=8", 4)
    assert model.fixed_batch is None, model.fixed_by
    assert model.seq_dim == 1  # tokens in, logits out: sequence parallelism splits dim 1
    cmp = check_against_sequential(model, parse_strategy(strategy))
    assert cmp.max_rel_diff < 1e-4, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"


@pytest.mark.xdist_group("onnx-mistral")
@pytest.mark.slow
def test_a_mistral_exports_weights_are_placed_by_the_modules_using_them(mistral: Path) -> None:
    """The exporter renames the projections' transposed weights (``val_N``); the modules that read
    them say what they are: q/k/v, gate and up column-parallel, o and down row-parallel, the
    embedding and the head split on the vocabulary, norms and the rotary frequencies whole."""
    from distir.ir.dtensor import Replicate, Shard

    model = load_file(f"{mistral}:seq=8", 4)
    by_shape: dict[tuple[tuple[int, ...], str], set[object]] = {}
    for w in model.weights:
        kind = w.name.split(".")[-1] if "." in w.name else "val"
        by_shape.setdefault((w.type.shape, kind), set()).add(w.tp)
    assert by_shape[((50, 32), "weight")] == {Shard(0)}  # embed_tokens: vocabulary-parallel
    assert by_shape[((32, 32), "val")] == {Shard(1), Shard(0)}  # q_proj column, o_proj row
    assert by_shape[((32, 16), "val")] == {Shard(1)}  # k_proj, v_proj (GQA: 2 heads of 8)
    assert by_shape[((32, 64), "val")] == {Shard(1)}  # gate_proj, up_proj
    assert by_shape[((64, 32), "val")] == {Shard(0)}  # down_proj
    assert by_shape[((32, 50), "val")] == {Shard(1)}  # lm_head, so the logits reach the loss split
    assert model.loss_input_tp == Shard(2)
    assert all(w.tp == Replicate() for w in model.weights if w.type.rank == 1)


@pytest.mark.xdist_group("onnx-mistral")
@pytest.mark.slow
def test_a_mistral_export_trains_for_real_on_two_ranks_as_the_reference_executor_does(mistral: Path) -> None:
    """Run on 2 gloo ranks at d2·k2: each rank makes the positions and slices its share of the
    batch (a plain ``Redistribute`` lowered to local pieces), and every rank's loss and updated
    weights equal the reference executor's."""
    from distir.backend.launch import LaunchOptions, launch
    from distir.backend.program import model_program, rank_programs
    from distir.backend.verify import compare, reference_outputs

    prog = model_program(f"{mistral}:seq=8", "d2.t1.p1.k2.1f1b", 4)
    results = launch([[r] for r in rank_programs(prog)], LaunchOptions(timeout_s=120))
    want = reference_outputs(prog.module, prog.args)
    verdict = compare(prog.module, want, {rank[0].device: rank[0].outputs for rank in results})
    assert verdict.verified and verdict.checked > 1, verdict


@pytest.mark.xdist_group("onnx-mistral")
@pytest.mark.slow
def test_a_mistral_export_computes_in_the_dtype_asked_and_trains_in_mixed_precision(mistral: Path) -> None:
    """The file's floats are taken as the dtype asked (bf16: weights, Casts, constants), so it
    trains as the trainers do, in bf16 with fp32 masters: the default of ``simulate`` on an A100
    cluster, and the microbatched step equals the sequential one there."""
    from typer.testing import CliRunner

    from distir.cli import app
    from distir.ir.types import DType
    from distir.parallel.check import check_against_sequential

    model = load_file(f"{mistral}:seq=8", 4, DType.bf16)
    assert {w.type.dtype for w in model.weights} == {DType.bf16}
    casts = [i for f in model.module.functions for i in f.body if isinstance(i, Op) and i.name == "Cast"]
    assert all(op.attrs["to"] is DType.bf16 for op in casts if op.attrs["to"].is_float)
    cmp = check_against_sequential(model, parse_strategy("d2.t1.p1.k2.1f1b"), precision="mixed")
    assert cmp.max_rel_diff < 2e-2, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    args = ["--model", f"{mistral}:seq=8", "--strategy", "d2.t1.p1.k2.1f1b", "--batch", "4"]
    got = CliRunner().invoke(app, ["simulate", *args, "--cluster", "dgx-a100", "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.output)
    assert (out["dtype"], out["precision"]) == ("bf16", "mixed")


@pytest.mark.xdist_group("onnx-mistral")
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_fusions_hold_in_a_half_dtype(mistral: Path, dtype: str) -> None:
    """Taken as f16, the formulas' constants and the positions round (to about 1e-3): the
    fusions still find RMSNorm, SiLU and the rotary embedding, as in f32."""
    from distir.ir.types import DType

    model = load_file(f"{mistral}:seq=8", 4, DType(dtype))
    names = {i.name for f in model.module.functions for i in f.body if isinstance(i, Op)}
    assert {"RMSNormalization", "Silu", "Rope", "Attention"} <= names
    assert not {"Sin", "Cos", "Pow", "Sigmoid", "Softmax"} & names
