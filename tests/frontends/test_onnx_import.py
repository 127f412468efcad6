"""The ONNX importer: a 2-layer GPT-2 exported by ``torch.onnx.export(..., dynamo=True)`` imports
into layer functions, type-checks and computes what onnxruntime computes; the DistIR paper's
Figure 4 pattern (Shape → Slice → Concat → Reshape) keeps its ops and resolves its shapes; opset
attribute forms (Gemm, Split, Slice, Unsqueeze, ReduceSum across opsets) give onnxruntime's
results; bad files and unsupported ops are one-line errors naming every cause."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import distir  # noqa: E402
from distir.autodiff.train import Optimizer, training_step  # noqa: E402
from distir.frontends.onnx_import import OnnxImportError, import_onnx  # noqa: E402
from distir.frontends.onnx_import.model import to_model  # noqa: E402
from distir.interp.reference import run_reference  # noqa: E402
from distir.ir import parse_module  # noqa: E402
from distir.ir.ops import Call, Op  # noqa: E402

RNG = np.random.default_rng(0)


def _model(
    nodes: Sequence[Any],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    inits: Sequence[Any] = (),
    opset: int = 18,
) -> bytes:
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _ort(data: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds))


def _run(data: bytes | str, feeds: dict[str, np.ndarray], **kw: Any) -> tuple[Any, list[np.ndarray]]:
    imp = import_onnx(data, **kw)
    typed = distir.check(imp.module)
    return imp, [np.asarray(x) for x in run_reference(typed, imp.arguments(feeds))]


def _ops(module: Any) -> list[str]:
    return [i.name for f in module.functions for i in f.body if isinstance(i, Op)]


# -- GPT-2 exported by torch.onnx (dynamo): the exports are session fixtures (conftest.py) ------
# shared with test_onnx_model_batch.py; the tests using them run on one xdist worker (ONNX_GPT2)


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_a_tied_heads_folded_transpose_is_the_embedding_transposed(gpt2_with_torch: tuple[Path, Any]) -> None:
    """torch.onnx's optimizer stores GPT-2's tied head as a new initializer, the embedding's
    transpose (``val_N``): imported as that, the head is the embedding transposed, not a second
    weight of vocab × hidden parameters (the model's count is the torch module's, less what the
    exporter folded into other initializers: never more)."""
    path, lm = gpt2_with_torch
    imp = import_onnx(str(path), batch=2)
    weights = {w.name: w.value for w in imp.weights}
    pairs = [
        (a, b) for a, b in itertools.permutations(weights, 2)
        if weights[a].ndim == 2 and np.array_equal(weights[a].T, weights[b])
    ]  # fmt: skip
    assert pairs == []
    wte = lm.transformer.wte.weight.detach().numpy()
    (tied,) = [n for n, v in weights.items() if v.shape == wte.shape and np.array_equal(v, wte)]
    post = imp.module.functions[[f.name for f in imp.module.functions].index("post")]
    transposes = [op for op in post.ops() if op.name == "Transpose" and op.inputs[0].name == tied]
    assert len(transposes) == 1 and transposes[0].attrs["perm"] == (1, 0)
    assert imp.num_params <= sum(p.numel() for p in lm.parameters())


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_the_exporters_gelu_formula_is_one_gelu_tanh(gpt2_with_torch: tuple[Path, Any]) -> None:
    """GPT-2's gelu_new, written out by the exporter (Mul, Pow, Add, Tanh on scalar constants),
    imports as one GeluTanh per block; the logits still match onnxruntime (the tests above)."""
    path, _ = gpt2_with_torch
    imp = import_onnx(str(path), batch=2)
    block = imp.module.functions[[f.name for f in imp.module.functions].index("block")]
    names = [op.name for op in block.ops()]
    assert names.count("GeluTanh") == 1 and not {"Tanh", "Pow"} & set(names)


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_gpt2_export_imports_verifies_and_matches_onnxruntime(gpt2_onnx: Path) -> None:
    ids = RNG.integers(0, 50, (2, 8))
    imp, (logits,) = _run(str(gpt2_onnx), {"input_ids": ids})
    (want,) = _ort(gpt2_onnx.read_bytes(), {"input_ids": ids})
    assert logits.shape == (2, 8, 50)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    names = {w.name for w in imp.weights}
    assert {"m.transformer.h.0.attn.c_attn.weight", "m.transformer.h.1.mlp.c_proj.weight"} <= names
    assert [p.name for p in imp.inputs] == ["input_ids"]


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_gpt2_blocks_become_one_layer_function_called_per_block(gpt2_onnx: Path) -> None:
    imp = import_onnx(str(gpt2_onnx))
    assert imp.layers == ("pre", "block", "block", "post"), imp.note
    entry = imp.module.entry
    assert all(isinstance(i, Call) for i in entry.body)
    calls = [i for i in entry.body if isinstance(i, Call)]
    # each call passes the previous one's result first: a chain
    for a, b in itertools.pairwise(calls):
        assert b.inputs[0] is a.outputs[0]
    # block 0 gets layer 0's weights, block 1 layer 1's
    assert "m.transformer.h.0.attn.c_attn.weight" in [v.name for v in calls[1].inputs]
    assert "m.transformer.h.1.attn.c_attn.weight" in [v.name for v in calls[2].inputs]
    assert _ops(imp.module).count("Gemm") == 4  # the block's four projections, once
    assert imp.op_counts()["Gemm"] == 8  # ... run by both blocks
    flat = import_onnx(str(gpt2_onnx), layers=False)
    layered, whole = imp.op_counts(), flat.op_counts()
    del layered["Constant"], whole["Constant"]  # constants are copied into each layer
    assert layered == whole


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_gpt2_single_function_import_computes_the_same(gpt2_onnx: Path) -> None:
    ids = RNG.integers(0, 50, (2, 8))
    imp, (flat,) = _run(str(gpt2_onnx), {"input_ids": ids}, layers=False)
    _, (layered,) = _run(str(gpt2_onnx), {"input_ids": ids})
    assert imp.layers == () and len(imp.module.functions) == 1
    np.testing.assert_array_equal(flat, layered)


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_gpt2_as_a_model_trains_like_torch(gpt2_with_torch: tuple[Path, Any]) -> None:
    """``to_model``: the import plus a cross-entropy loss keeps the model contract; one SGD step
    of the training program (autodiff through every imported op) gives torch autograd's loss
    and gradients for the block weights (which the export keeps as they are)."""
    torch = pytest.importorskip("torch")
    path, lm = gpt2_with_torch
    imp = import_onnx(str(path))
    model = to_model(imp, "gpt2-onnx")
    assert [c.callee for c in model.layers] == ["pre", "block", "block", "post", "loss"]
    assert (model.pre, model.post, model.batch) == (1, 2, 2)
    ids, labels = RNG.integers(0, 50, (2, 8)), RNG.integers(0, 50, (2, 8))
    vals = {
        p.name: a for p, a in zip(imp.module.entry.params, imp.arguments({"input_ids": ids}), strict=True)
    }
    vals["labels"] = labels
    lr = 1.0
    step = training_step(model, Optimizer("sgd", lr=lr))
    outs = run_reference(step, [vals[p.name] for p in step.entry.params])
    lm.zero_grad()
    logits = lm(input_ids=torch.from_numpy(ids), use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), torch.from_numpy(labels).reshape(-1))
    loss.backward()
    np.testing.assert_allclose(outs[0], loss.item(), rtol=1e-5)
    params = dict(lm.named_parameters())
    compared = 0
    for k, w in enumerate(model.weights):
        name = w.name.removeprefix("m.")
        if name.startswith("transformer.h."):
            grad = (vals[w.name] - outs[1 + k]) / lr
            np.testing.assert_allclose(grad, params[name].grad.numpy(), rtol=1e-3, atol=1e-6, err_msg=name)
            compared += 1
    # per block: two norms' scale and bias, four projections (the exporter drops the projections'
    # biases, zero at init, with the Add of zeros)
    assert compared == 2 * 8


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
@pytest.mark.parametrize(("batch", "seq"), [(2, 8), (3, 5)])
def test_gpt2_dynamic_export_resolves_at_the_sizes_given(
    gpt2_dynamic_onnx: Path, batch: int, seq: int
) -> None:
    ids = RNG.integers(0, 50, (batch, seq))
    imp, (logits,) = _run(str(gpt2_dynamic_onnx), {"input_ids": ids}, dims={"batch": batch, "seq": seq})
    (want,) = _ort(gpt2_dynamic_onnx.read_bytes(), {"input_ids": ids})
    assert logits.shape == (batch, seq, 50)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    assert imp.layers == ("pre", "block", "block", "post"), imp.note
    ops = set(_ops(imp.module))
    assert {"Shape", "Concat", "Reshape", "Range"} <= ops
    # the causal mask, computed from the sizes (Range, CumSum, comparisons), is known at import:
    # the decomposed attention it masks is the fused one, and the mask's ops are gone
    assert "Attention" in ops and not {"Softmax", "CumSum", "IsNaN"} & ops


@pytest.mark.xdist_group("onnx-gpt2")
@pytest.mark.slow
def test_the_exporters_decomposed_attention_is_the_fused_one(gpt2_with_torch: tuple[Path, Any]) -> None:
    """q·kᵀ scaled, the causal mask added, softmax, the NaN guard and the product with v (the
    exporter's scaled-dot-product attention) import as one causal ``Attention`` in BSHD, no head
    transpose around it, the mask no longer a weight: no S×S value left in the program."""
    path, _ = gpt2_with_torch
    imp = import_onnx(str(path), batch=2)
    block = imp.module.functions[[f.name for f in imp.module.functions].index("block")]
    (att,) = [op for op in block.ops() if op.name == "Attention"]
    assert att.attrs["causal"] is True and att.attrs["scale"] == pytest.approx(1 / np.sqrt(8))
    assert not {"Softmax", "IsNaN", "Where", "Transpose"} & {op.name for op in block.ops()}
    assert all(w.value.shape[-2:] != (8, 8) for w in imp.weights)  # the (B, 1, S, S) mask


# -- the DistIR paper's Figure 4: a reshape whose target comes from Shape -------------------------
def _fig4(opset: int) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 5])
    w = numpy_helper.from_array(RNG.standard_normal((6, 5)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(5).astype(np.float32), "b")
    minus1 = numpy_helper.from_array(np.array([-1], np.int64), "minus1")
    two, three = (numpy_helper.from_array(np.array([k], np.int64), f"c{k}") for k in (2, 3))
    if opset >= 10:
        sl = helper.make_node("Slice", ["s", "c2", "c3"], ["last"], name="slice")
    else:
        sl = helper.make_node("Slice", ["s"], ["last"], name="slice", starts=[2], ends=[3])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        sl,
        helper.make_node("Concat", ["minus1", "last"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"], name="reshape"),
        helper.make_node("Gemm", ["flat", "w", "b"], ["y"], name="gemm"),
    ]
    return _model(nodes, [x], [y], [w, b, minus1, two, three], opset)


@pytest.mark.parametrize("opset", [9, 13])
def test_figure4_shape_subgraph_is_kept_and_resolves(opset: int) -> None:
    data = _fig4(opset)
    x = RNG.standard_normal((3, 4, 6)).astype(np.float32)
    imp, (y,) = _run(data, {"x": x}, dims={"N": 3})
    assert [n for n in _ops(imp.module) if n != "Constant"][:4] == ["Shape", "Slice", "Concat", "Reshape"]
    typed = distir.check(imp.module)
    gemm = next(i for i in typed.entry.body if isinstance(i, Op) and i.name == "Gemm")
    assert gemm.inputs[0].type is not None and gemm.inputs[0].type.shape == (12, 6)
    w, b = (p.value for p in imp.weights)
    assert w is not None and b is not None
    np.testing.assert_allclose(y, x.reshape(-1, 6) @ w + b, rtol=1e-5)
    np.testing.assert_allclose(y, _ort(data, {"x": x})[0], rtol=1e-5)
    # the printed program alone resolves the same shapes (the checker, not the importer)
    again = distir.check(parse_module(str(imp.module)))
    assert [v.type for v in again.entry.outputs] == [v.type for v in typed.entry.outputs]


def test_figure4_follows_the_batch_given_for_a_dynamic_dim() -> None:
    for n in (1, 5):
        imp = import_onnx(_fig4(13), dims={"N": n})
        (out,) = distir.check(imp.module).entry.outputs
        assert out.type is not None and out.type.shape == (4 * n, 5)
    imp = import_onnx(_fig4(13), batch=7)  # dim 0 without a size: the default batch
    assert imp.inputs[0].type.shape == (7, 4, 6)


# -- an MLP with Gemm's attributes --------------------------------------------------------------
def test_mlp_with_gemm_attributes_matches_numpy_and_onnxruntime() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 5])
    w1 = RNG.standard_normal((3, 4)).astype(np.float32)  # (out, in): transB=1
    b1 = RNG.standard_normal(3).astype(np.float32)
    w2 = RNG.standard_normal((3, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], alpha=0.5, beta=2.0, transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))]
    data = _model(nodes, [x], [y], inits, 13)
    xv = RNG.standard_normal((6, 4)).astype(np.float32)
    imp, (got,) = _run(data, {"x": xv}, batch=6)
    z = np.maximum(0.5 * xv @ w1.T + 2.0 * b1, 0) @ w2
    want = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(got, _ort(data, {"x": xv})[0], rtol=1e-5)
    assert [w.name for w in imp.weights] == ["w1", "b1", "w2"]
    assert imp.layers == () and "no repeated module blocks" in imp.note


# -- opset attribute forms ------------------------------------------------------------------------
def _opset_graph(opset: int) -> bytes:
    """Unsqueeze, Split, Slice, ReduceSum, Squeeze in the form of ``opset``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    outs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
        for n, s in (("a", [1, 3]), ("b", [4, 2]), ("c", [4, 3]))
    ]
    consts = {"ax0": [0], "sizes": [2, 4], "st": [1], "en": [4], "sax": [2], "rax": [1]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    if opset < 13:
        nodes = [
            helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
            helper.make_node("Split", ["u"], ["s1", "s2"], axis=2, split=[2, 4]),
            helper.make_node("Slice", ["s2", "st", "en", "sax"], ["sl"]),
            helper.make_node("ReduceSum", ["sl"], ["a"], axes=[1], keepdims=0),
            helper.make_node("Squeeze", ["s1"], ["b"], axes=[0]),
        ]
    else:
        split = helper.make_node("Split", ["u", "sizes"], ["s1", "s2"], axis=2)  # sizes: an input
        nodes = [
            helper.make_node("Unsqueeze", ["x", "ax0"], ["u"]),
            split,
            helper.make_node("Slice", ["s2", "st", "en", "sax"], ["sl"]),
            helper.make_node("ReduceSum", ["sl", "rax"], ["a"], keepdims=0),
            helper.make_node("Squeeze", ["s1", "ax0"], ["b"]),
        ]
    nodes.append(
        helper.make_node("Split", ["x"], ["c", "rest"], axis=1, **({"num_outputs": 2} if opset >= 18 else {}))
    )
    return _model(nodes, [x], outs, inits, opset)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_opset_attribute_forms_match_onnxruntime(opset: int) -> None:
    data = _opset_graph(opset)
    xv = RNG.standard_normal((4, 6)).astype(np.float32)
    _, got = _run(data, {"x": xv})
    for g, w in zip(got, _ort(data, {"x": xv}), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_mask_ops_match_onnxruntime() -> None:
    """Range, Trilu, ConstantOfShape, comparisons, IsNaN, Where, Max, Cast: a causal mask."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 5])
    m = helper.make_tensor_value_info("m", TensorProto.INT64, [5, 5])
    consts = {"zero": 0, "five": 5, "one": 1}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    inits.append(numpy_helper.from_array(np.array([5, 5], np.int64), "shape"))
    nodes = [
        helper.make_node("Range", ["zero", "five", "one"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "zero_ax"], ["row"]),
        helper.make_node("Constant", [], ["zero_ax"], value_ints=[1]),
        helper.make_node("LessOrEqual", ["r", "row"], ["keep"]),
        helper.make_node(
            "ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.array([1.0], np.float32))
        ),
        helper.make_node("Trilu", ["ones"], ["tri"], upper=0),
        helper.make_node("Mul", ["x", "tri"], ["xt"]),
        helper.make_node("Max", ["xt", "x"], ["mx"]),
        helper.make_node("Div", ["mx", "xt"], ["q"]),
        helper.make_node("IsNaN", ["q"], ["nan"]),
        helper.make_node("Not", ["keep"], ["drop"]),
        helper.make_node("Or", ["nan", "drop"], ["bad"]),
        helper.make_node("Where", ["bad", "x", "q"], ["y"]),
        helper.make_node("Cast", ["keep"], ["m"], to=TensorProto.INT64),
    ]
    nodes.insert(1, nodes.pop(2))  # the Constant before its use
    data = _model(nodes, [x], [y, m], inits, 18)
    xv = RNG.standard_normal((5, 5)).astype(np.float32)
    xv[0, 0] = 0.0  # 0/0: a NaN for IsNaN
    with np.errstate(divide="ignore", invalid="ignore"):
        _, got = _run(data, {"x": xv})
    for g, w in zip(got, _ort(data, {"x": xv}), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_conv_net_and_activations_match_onnxruntime() -> None:
    """Conv, MaxPool, Flatten, LayerNormalization, Gelu (exact and tanh), Dropout at inference,
    Pow with an integer exponent, Sqrt, Transpose: opset 20 forms."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    arrays = {
        "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "cb": RNG.standard_normal(4).astype(np.float32),
        "ls": RNG.standard_normal(16).astype(np.float32),
        "lb": RNG.standard_normal(16).astype(np.float32),
        "fc": RNG.standard_normal((4, 16)).astype(np.float32),
    }
    inits = [numpy_helper.from_array(a, k) for k, a in arrays.items()]
    inits.append(numpy_helper.from_array(np.array(2, np.int64), "two"))
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[3, 3]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("LayerNormalization", ["f", "ls", "lb"], ["n"], epsilon=1e-3),
        helper.make_node("Gelu", ["n"], ["g1"]),
        helper.make_node("Gelu", ["g1"], ["g2"], approximate="tanh"),
        helper.make_node("Dropout", ["g2"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("Sqrt", ["sq"], ["r"]),
        helper.make_node("Gemm", ["r", "fc"], ["y"], transB=1),
    ]
    data = _model(nodes, [x], [y], inits, 20)
    xv = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    _, (got,) = _run(data, {"x": xv})
    np.testing.assert_allclose(got, _ort(data, {"x": xv})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        *((op, TensorProto.FLOAT) for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")),
        *((op, TensorProto.BOOL) for op in ("And", "Or")),
        *((op, TensorProto.INT64) for op in ("Max", "Min", "Equal")),
    ],
)
def test_binary_compare_and_logic_ops_match_onnxruntime(op: str, dtype: int) -> None:
    a = helper.make_tensor_value_info("a", dtype, [3, 1])
    b = helper.make_tensor_value_info("b", dtype, [4])
    out = TensorProto.BOOL if op not in ("Max", "Min") else dtype
    c = helper.make_tensor_value_info("c", out, [3, 4])
    data = _model([helper.make_node(op, ["a", "b"], ["c"])], [a, b], [c], (), 13)
    np_dt = {TensorProto.FLOAT: np.float32, TensorProto.BOOL: np.bool_, TensorProto.INT64: np.int64}[dtype]
    av, bv = (RNG.integers(0, 3, shape).astype(np_dt) for shape in ((3, 1), (4,)))  # ties included
    _, (got,) = _run(data, {"a": av, "b": bv})
    np.testing.assert_array_equal(got, _ort(data, {"a": av, "b": bv})[0])


@pytest.mark.slow
def test_torch_mlp_blocks_import_as_layers_and_match_torch() -> None:
    """A PyTorch MLP of repeated blocks (``blocks.N``) exported with dynamic batch: one layer
    function for the block (its Linear as the exporter writes it: Gemm or MatMul), torch's
    eager output as the oracle at a batch other than the export's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.set_num_threads(1)
    torch.manual_seed(1)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x: Any) -> Any:
            return x + torch.relu(self.fc(x))

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(8, 16)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
            self.out = torch.nn.Linear(16, 4)

        def forward(self, x: Any) -> Any:
            h = self.inp(x)
            for b in self.blocks:
                h = b(h)
            return torch.softmax(self.out(h), dim=-1)

    mlp = MLP().eval()
    program = torch.onnx.export(
        mlp,
        (torch.randn(2, 8),),
        dynamo=True,
        input_names=["x"],
        dynamic_shapes=({0: torch.export.Dim("n")},),
    )
    data = program.model_proto.SerializeToString()
    xv = RNG.standard_normal((5, 8)).astype(np.float32)
    imp, (got,) = _run(data, {"x": xv}, dims={"n": 5})
    with torch.no_grad():
        want = mlp(torch.from_numpy(xv)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert imp.layers == ("pre", "block", "block", "block", "post"), imp.note


def test_cumsum_and_gather_nd_match_onnxruntime() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("a", [3, 4]), ("g", [2, 4]))]
    idx = numpy_helper.from_array(np.array([[2], [-3]], np.int64), "idx")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [
        helper.make_node("CumSum", ["x", "one"], ["c"], exclusive=1, reverse=1),
        helper.make_node("Add", ["c", "x"], ["a"]),
        helper.make_node("GatherND", ["a", "idx"], ["g"]),
    ]
    data = _model(nodes, [x], outs, [idx, one], 13)
    xv = RNG.standard_normal((3, 4)).astype(np.float32)
    _, got = _run(data, {"x": xv})
    np.testing.assert_allclose(got[0], np.cumsum(xv[:, ::-1], axis=1)[:, ::-1], rtol=1e-5)  # numpy oracle
    for g, w in zip(got, _ort(data, {"x": xv}), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5)


# -- errors ---------------------------------------------------------------------------------------
def test_malformed_bytes_are_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(OnnxImportError, match="not an ONNX model") as e:
        import_onnx(b"\x08\x07garbage\xff\xff not protobuf")
    assert "\n" not in str(e.value)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01\x02")
    with pytest.raises(OnnxImportError, match=r"bad\.onnx: not an ONNX model"):
        import_onnx(bad)
    with pytest.raises(OnnxImportError, match=r"missing\.onnx: cannot read the file"):
        import_onnx(tmp_path / "missing.onnx")


def test_unsupported_ops_are_all_listed_with_counts_and_node_names() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    nodes = [
        helper.make_node("Acos", ["x"], ["c1"], name="acos1"),
        helper.make_node("Erf", ["c1"], ["e"], name="erf"),
        helper.make_node("Acos", ["e"], ["c2"], name="acos2"),
        helper.make_node("Relu", ["c2"], ["y"], name="relu"),
    ]
    with pytest.raises(OnnxImportError) as e:
        import_onnx(_model(nodes, [x], [y]))
    msg = str(e.value)
    assert "3 node(s)" in msg and "Acos ×2 (acos1, acos2)" in msg and "Erf ×1 (erf)" in msg
    assert "Relu" not in msg and "\n" not in msg


def test_dynamic_dim_without_a_size_is_named() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "seq"])
    data = _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y])
    with pytest.raises(OnnxImportError, match=r"graph input x: dim 1 \(seq\) is dynamic"):
        import_onnx(data)
    assert import_onnx(data, dims={"seq": 3}).inputs[0].type.shape == (2, 3)


def test_a_shape_known_only_at_run_time_is_named() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    data = _model([helper.make_node("Expand", ["x", "s"], ["y"], name="ex")], [x, s], [y])
    with pytest.raises(
        OnnxImportError, match=r"node ex \(Expand\): its shape \(input 2\) is computed at run time"
    ):
        import_onnx(data)


@pytest.mark.xdist_group("onnx-gpt2")
def test_distir_import_of_an_onnx_file_prints_its_program_and_summary(gpt2_onnx: Path) -> None:
    """``distir import model.onnx``: the model with its loss layer at the file's batch (2), the
    summary's parameters those of the imported weights; split options and other dtypes refused."""
    from typer.testing import CliRunner

    from distir.cli import app

    r = CliRunner().invoke(app, ["import", str(gpt2_onnx), "--batch", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    imp = import_onnx(str(gpt2_onnx), batch=2)
    assert info["params"] == imp.num_params and info["batch"] == 2
    assert info["functions"]["block"]["calls"] == 2 and "@loss" in info["program"]
    for bad in (["--split", "m.transformer.h.1"], ["--dtype", "bf16"]):
        r = CliRunner().invoke(app, ["import", str(gpt2_onnx), *bad])
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = CliRunner().invoke(app, ["import", str(gpt2_onnx.with_name("missing.onnx"))])
    assert r.exit_code == 2 and "no such model file" in r.stderr
