"""Imported models compute what torch computes: the loss and every weight's gradient of the
training step on distir's reference executor equal torch eager's (float64, the same weights),
for a torch MLP and tiny GPT-2, Llama, Qwen2, Mistral and Mixtral (mixture-of-experts) models
built by transformers from their configs; repeated blocks share one layer function."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from distir.autodiff.train import Optimizer, training_step  # noqa: E402
from distir.frontends.torch_import import import_module, weight_values  # noqa: E402
from distir.frontends.torch_import.hf import hf_model  # noqa: E402
from distir.frontends.zoo import build_model  # noqa: E402
from distir.interp.reference import run_reference  # noqa: E402
from distir.ir.types import DType  # noqa: E402
from distir.ir.verify import verify  # noqa: E402

CONFIGS = Path(__file__).parent / "configs"
BATCH = 3
torch.set_num_threads(1)


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class MLP(torch.nn.Module):
    """An input projection, repeated residual blocks, a classifier head."""

    def __init__(self, inputs: int = 5, width: int = 6, classes: int = 4, layers: int = 3) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(inputs, width)
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(layers))
        self.out = torch.nn.Linear(width, classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        for layer in self.layers:
            h = layer(h)
        return self.out(h)


def _check_against_torch(
    module: torch.nn.Module,
    inputs: object,
    x: torch.Tensor,
    labels: torch.Tensor,
    rtol: float = 1e-9,
    torch_attention: str | None = None,
) -> None:
    """The imported training step's loss and gradients against torch's (``torch_attention``: the
    Hugging Face attention implementation torch runs, after the import traced distir's)."""
    module = module.double()
    model = import_module(module, inputs, batch=x.shape[0], dtype=DType.f64)
    if torch_attention is not None:
        module.config._attn_implementation = torch_attention
    vals = {model.inputs[0].name: x.numpy(), "labels": labels.numpy(), **weight_values(model, module)}
    step = training_step(model, Optimizer("sgd", lr=1.0))
    verify(step)
    out = run_reference(step, [vals[p.name] for p in step.entry.params])
    module.zero_grad()
    y = module(x) if not isinstance(inputs, dict) else module(input_ids=x, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(y.reshape(-1, y.shape[-1]), labels.reshape(-1), reduction="mean")
    loss.backward()
    assert float(out[0]) == pytest.approx(loss.item(), rel=rtol)
    params = dict(module.named_parameters(remove_duplicate=False))
    transposed = set(model.config["transposed"])  # type: ignore[call-overload]
    for k, w in enumerate(model.weights):
        grad = vals[w.name] - out[1 + k]
        g = params[w.name].grad
        want = (g.T if w.name in transposed else g).numpy()
        np.testing.assert_allclose(grad, want, rtol=max(rtol, 1e-7), atol=rtol * 1e-2, err_msg=w.name)


def test_mlp_loss_and_gradients_equal_torch() -> None:
    torch.manual_seed(0)
    mlp = MLP()
    x = torch.randn(BATCH, 5, dtype=torch.float64)
    labels = torch.randint(0, 4, (BATCH,))
    _check_against_torch(mlp, (x,), x, labels)


class TorchBlock(torch.nn.Module):
    """A pre-norm block of torch's own modules: nn.MultiheadAttention (its packed in-projection
    unflattened) and an nn.Sequential MLP with more numbered children (3) than the model has
    blocks (2)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        a, _ = self.attn(y, y, y, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class TorchTransformer(torch.nn.Module):
    def __init__(self, vocab: int = 11, width: int = 8, heads: int = 2, seq: int = 5) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Parameter(torch.randn(seq, width))
        self.blocks = torch.nn.ModuleList(TorchBlock(width, heads) for _ in range(2))
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_torch_multihead_attention_and_sequential_mlp_blocks_equal_torch() -> None:
    """The blocks are ``blocks.N`` (not the MLP's ``mlp.N``), one layer function, and the step
    equals torch's."""
    torch.manual_seed(0)
    m = TorchTransformer()
    ids = torch.randint(0, 11, (BATCH, 5))
    labels = torch.randint(0, 11, (BATCH, 5))
    model = import_module(m, (ids,), batch=BATCH)
    assert model.config["layer_paths"] == ("pre", "blocks.0", "blocks.1", "post")
    _check_against_torch(m, (ids,), ids, labels)


# HF's RMSNorm and rotary embedding compute in float32 even in a float64 model (an explicit cast,
# which the importer reads as the model's dtype): those models agree to float32's precision
F32_INSIDE = 1e-4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "rtol"),
    [
        ("gpt2-tiny", 1e-9),
        ("llama-tiny", F32_INSIDE),
        ("qwen2-tiny", F32_INSIDE),
        ("mistral-tiny", F32_INSIDE),
        ("mixtral-tiny", F32_INSIDE),  # 2 layers, 4 experts, top-2: each block one MoE op
        ("qwen2-moe-tiny", F32_INSIDE),  # the same, with Qwen2-MoE's sigmoid-gated shared expert
    ],
)
def test_hf_model_loss_and_gradients_equal_torch(config: str, rtol: float) -> None:
    torch.manual_seed(0)
    module, inputs = hf_model(str(CONFIGS / f"{config}.json"), meta=False)
    module.config._experts_implementation = "eager"  # HF's loop over experts (it runs f64)
    seq = inputs["input_ids"].shape[1]
    x = torch.randint(0, 32, (BATCH, seq))
    labels = torch.randint(0, 32, (BATCH, seq))
    _check_against_torch(module, inputs, x, labels, rtol)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "block_weights"), [("gpt2-tiny", 12), ("llama-tiny", 9), ("qwen2-tiny", 12)]
)
def test_repeated_blocks_share_one_layer_function(config: str, block_weights: int) -> None:
    module, inputs = hf_model(str(CONFIGS / f"{config}.json"))
    model = import_module(module, inputs, batch=2)
    callees = [c.callee for c in model.layers]
    assert callees == ["embed", "block", "block", "head", "loss"]
    assert (model.pre, model.post) == (1, 2)
    assert len(model.module["block"].params) == 1 + block_weights


@pytest.mark.slow
@pytest.mark.parametrize("config", ["gpt2-tiny", "llama-tiny"])
def test_shallow_trace_deepened_equals_the_full_trace(config: str, tmp_path: Path) -> None:
    """``hf:`` traces 2 blocks of a config whose blocks are alike and repeats the block: the
    program is the one the full-depth trace gives."""
    import json

    from distir.frontends.torch_import.source import _converted
    from distir.ir.printer import print_module

    raw = json.loads((CONFIGS / f"{config}.json").read_text())
    raw["n_layer" if "n_layer" in raw else "num_hidden_layers"] = 4
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    _converted.cache_clear()
    deep = build_model(f"hf:{path}", batch=2)
    module, inputs = hf_model(str(path))
    full = import_module(module, inputs, batch=2, name=f"hf:{path}")
    assert [c.callee for c in deep.layers] == ["embed", *["block"] * 4, "head", "loss"]
    assert print_module(deep.module) == print_module(full.module)
    assert deep.weights == full.weights and deep.config["layer_paths"] == full.config["layer_paths"]
