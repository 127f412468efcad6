"""Pipeline split points (PiPPy's semantics): ``distir.pipe_split()`` markers and ``split``
module names make the stage functions; a skip connection is forwarded through the middle stage; a
parameter used by two stages is replicated (tied) or transmitted; the pipelined training step
equals the sequential one."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import distir  # noqa: E402
from distir.frontends.torch_import import SplitError, import_module  # noqa: E402
from distir.frontends.zoo.model import ModelError, check_model  # noqa: E402
from distir.interp.lockstep import check_deadlock_free  # noqa: E402
from distir.interp.project import project  # noqa: E402
from distir.ir.printer import print_function  # noqa: E402
from distir.ir.types import DType  # noqa: E402
from distir.parallel.check import check_against_sequential  # noqa: E402
from distir.parallel.strategy import parse_strategy  # noqa: E402

D = 4
torch.set_num_threads(1)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(D, D)

    def forward(self, x: Any, w: Any = None, relu: bool = False) -> Any:
        x = torch.relu(x) if relu else x
        return self.lin(x if w is None else torch.mm(x, w))


class PiPPyExample(torch.nn.Module):
    """PiPPy's example: ``mm_param`` is used by stages 0 and 1, ``lin`` by stages 1 and 2, and
    ``skip`` goes from stage 0 to stage 2. ``markers=False``: the same program without markers
    (split by module name: the boundaries before ``first`` and ``last``)."""

    def __init__(self, markers: bool = True) -> None:
        super().__init__()
        self.markers = markers
        self.mm_param = torch.nn.Parameter(torch.randn(D, D))
        self.mm_param2 = torch.nn.Parameter(torch.randn(D, D))
        self.lin = torch.nn.Linear(D, D)
        self.first = Block()
        self.last = Block()

    def forward(self, x: Any) -> Any:
        x = torch.mm(x, self.mm_param)
        skip = x
        x = torch.relu(x)
        if self.markers:
            distir.pipe_split()
        x = self.first(x, self.mm_param)
        x = self.lin(x)
        if self.markers:
            distir.pipe_split()
        x = self.last(x, relu=True) + skip
        x = torch.mm(x, self.mm_param2)
        return self.lin(x)


def _import(multi_use: str = "replicate", batch: int = 8, dtype: DType = DType.f32, **kw: Any) -> Any:
    torch.manual_seed(0)
    module = PiPPyExample(**kw.pop("module_kw", {}))
    return import_module(
        module, (torch.randn(batch, D),), batch=batch, dtype=dtype, multi_use=multi_use, **kw
    )


def _stages_text(model: Any) -> str:
    fns = [model.module[f"stage{k}"] for k in range(3)]
    calls = [line for line in str(model.module.entry).splitlines() if "= @" in line]
    return "\n".join([*(print_function(f) for f in fns), *calls])


GOLDEN_REPLICATE = """\
func @stage0(%x, %mm_param) {
  %matmul = MatMul(%x, %mm_param)
  %relu = Relu(%matmul)
  %concat = Concat(%matmul, %relu, axis=1)
  return %concat
}
func @stage1(%x, %mm_param, %first.lin.weight, %first.lin.bias, %lin.weight, %lin.bias) {
  %slice = Slice(%x, starts=[0], ends=[4], axes=[1])
  %slice_1 = Slice(%x, starts=[4], ends=[8], axes=[1])
  %matmul = MatMul(%slice_1, %mm_param)
  %matmul_1 = MatMul(%matmul, %first.lin.weight)
  %add = Add(%matmul_1, %first.lin.bias)
  %matmul_2 = MatMul(%add, %lin.weight)
  %add_1 = Add(%matmul_2, %lin.bias)
  %concat = Concat(%slice, %add_1, axis=1)
  return %concat
}
func @stage2(%x, %lin.weight, %lin.bias, %last.lin.weight, %last.lin.bias, %mm_param2) {
  %slice = Slice(%x, starts=[0], ends=[4], axes=[1])
  %slice_1 = Slice(%x, starts=[4], ends=[8], axes=[1])
  %relu = Relu(%slice_1)
  %matmul = MatMul(%relu, %last.lin.weight)
  %add = Add(%matmul, %last.lin.bias)
  %add_1 = Add(%add, %slice)
  %matmul_1 = MatMul(%add_1, %mm_param2)
  %matmul_2 = MatMul(%matmul_1, %lin.weight)
  %add_2 = Add(%matmul_2, %lin.bias)
  return %add_2
}
  %x0 = @stage0(%x, %mm_param)
  %x1 = @stage1(%x0, %mm_param, %first.lin.weight, %first.lin.bias, %lin.weight, %lin.bias)
  %x2 = @stage2(%x1, %lin.weight, %lin.bias, %last.lin.weight, %last.lin.bias, %mm_param2)
  %loss = @loss(%x2, %labels)"""


def test_replicate_ties_the_shared_parameters_and_forwards_the_skip_connection() -> None:
    """Stage 0 sends the skip value (%matmul) with its activation; stage 1 passes it on
    untouched; stage 2 adds it. ``mm_param`` (stages 0, 1) and ``lin`` (stages 1, 2) are taken
    by both of their stages: tied weights."""
    model = _import("replicate")
    check_model(model)
    assert _stages_text(model) == GOLDEN_REPLICATE
    assert set(model.tied) == {"mm_param", "lin.weight", "lin.bias"}
    assert model.config["layer_paths"] == ("stage0", "stage1", "stage2")


def test_transmit_takes_the_same_stages_and_marks_the_shared_parameters() -> None:
    """Transmitting changes who keeps a shared parameter, not the stage functions: each stage
    takes it as a weight (the replicate golden), and ``Model.transmitted`` names them, so the
    pipeline sends each from its owner instead of keeping a copy (next test)."""
    model = _import("transmit")
    check_model(model)
    assert _stages_text(model) == GOLDEN_REPLICATE
    assert set(model.transmitted) == set(model.tied) == {"mm_param", "lin.weight", "lin.bias"}


@pytest.mark.parametrize("k", [2, 4])
def test_transmit_sends_each_shared_parameter_once_per_step(k: int) -> None:
    """Under ``p3``, a transmitted parameter is an entry parameter once (its owner's, with its
    optimizer state); its value crosses to the other stage once per step and its gradient comes
    back once, whatever the number of microbatches, while the replicated policy keeps a copy
    (a second parameter with its own state) and exchanges the gradients (two sends that cross)."""
    from collections import Counter

    from distir.autodiff.train import Optimizer
    from distir.parallel.distribute import distribute

    s = parse_strategy(f"d1.t1.p3.k{k}.1f1b")
    shared = ("mm_param", "lin.weight", "lin.bias")
    sends: dict[str, Counter[str]] = {}
    params: dict[str, Counter[str]] = {}
    for policy in ("transmit", "replicate"):
        dist = distribute(_import(policy, batch=8), s, Optimizer("adam"))
        entry = dist.entry
        params[policy] = Counter(p.name for p in entry.params)
        sends[policy] = Counter(
            op.outputs[0].name
            for op in entry.ops()
            if op.name == "MeshSend" and op.outputs[0].name[0] not in "ad"
        )
    for w in shared:
        assert params["transmit"][w] == 1 and params["transmit"][f"m_{w}"] == 1
        assert params["replicate"][w] == 2 and params["replicate"][f"m_{w}"] == 2
        assert sends["transmit"][w] == 1 and sends["transmit"][f"g_{w}_sent"] == 1
        assert sends["replicate"][f"g_{w}_tied"] == 2


def test_policy_per_parameter() -> None:
    model = _import({"lin.weight": "transmit", "lin.bias": "transmit"})
    assert set(model.tied) == {"mm_param", "lin.weight", "lin.bias"}
    assert model.transmitted == ("lin.weight", "lin.bias")


@pytest.mark.parametrize("multi_use", ["replicate", "transmit"])
def test_sequential_step_equals_torch(multi_use: str) -> None:
    """The imported (staged) program's loss and gradients are torch eager's: the original."""
    import numpy as np

    from distir.autodiff.train import Optimizer, training_step
    from distir.frontends.torch_import import weight_values
    from distir.interp.reference import run_reference

    torch.manual_seed(0)
    module = PiPPyExample().double()
    x = torch.randn(6, D, dtype=torch.float64)
    labels = torch.randint(0, D, (6,))
    model = import_module(module, (x,), batch=6, dtype=DType.f64, multi_use=multi_use)  # type: ignore[arg-type]
    vals = {model.inputs[0].name: x.numpy(), "labels": labels.numpy(), **weight_values(model, module)}
    step = training_step(model, Optimizer("sgd", lr=1.0))
    out = run_reference(step, [vals[p.name] for p in step.entry.params])
    module.zero_grad()
    loss = torch.nn.functional.cross_entropy(module(x), labels)
    loss.backward()
    assert float(out[0]) == pytest.approx(loss.item(), rel=1e-12)
    params = dict(module.named_parameters())
    transposed = set(model.config["transposed"])  # type: ignore[call-overload]
    for k, w in enumerate(model.weights):
        g = params[w.name].grad
        want = (g.T if w.name in transposed else g).numpy()
        np.testing.assert_allclose(vals[w.name] - out[1 + k], want, rtol=1e-9, atol=1e-12, err_msg=w.name)


@pytest.mark.parametrize("multi_use", ["replicate", "transmit"])
@pytest.mark.parametrize("strategy", ["d1.t1.p3.k2.1f1b", "d2.t1.p3.k2.1f1b", "d1.t2.p3.k4.gpipe"])
def test_pipelined_step_equals_sequential(multi_use: str, strategy: str) -> None:
    """Pipelining over the model's own three stages (with data or tensor parallelism) updates
    every weight as the sequential step does (which equals torch's: the test above)."""
    s = parse_strategy(strategy)
    model = _import(multi_use, batch=8, dtype=DType.f64)
    cmp = check_against_sequential(model, s)
    assert cmp.max_rel_diff < 1e-12, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    assert {n for n, r in cmp.results.items() if r[0] == "weight"} >= {w.name for w in model.weights}
    check_deadlock_free(project(cmp.materialized))


def test_split_by_module_name_equals_markers() -> None:
    """``split=("first", "last")`` on the program without markers: the boundaries before the
    modules ``first`` and ``last`` — the markers' places — give the same stages."""
    by_name = _import(split=("first", "last"), module_kw={"markers": False})
    assert _stages_text(by_name) == _stages_text(_import())


def test_split_on_a_module_that_does_not_exist() -> None:
    with pytest.raises(SplitError, match=r"split point 'model\.layers\.12': no op") as e:
        _import(split=("model.layers.12",), module_kw={"markers": False})
    assert isinstance(e.value, ModelError)
    assert "\n" not in str(e.value)


def test_unknown_multi_use_policy() -> None:
    with pytest.raises(SplitError, match="'copy' is not one of transmit, replicate"):
        _import("copy")


def test_cli_split_options() -> None:
    """``distir import SPEC --split first --split last`` prints the three stages; a split name
    that matches no module is one line on stderr, exit status 2."""
    from typer.testing import CliRunner

    from distir.cli import app

    spec = "tests.frontends.torch_models:pippy_example"
    r = CliRunner().invoke(
        app, ["import", spec, "--split", "first", "--split", "last", "--multi-use", "transmit"]
    )
    assert r.exit_code == 0, r.stderr
    assert (
        "%x2 = @stage2(%x1, %lin.weight, %lin.bias, %last.lin.weight, %last.lin.bias, %mm_param2)" in r.stdout
    )
    assert "tied weights: mm_param (transmitted), lin.weight (transmitted)" in r.stdout
    r = CliRunner().invoke(app, ["import", spec, "--split", "model.layers.12"])
    assert r.exit_code == 2
    assert r.stderr.strip().count("\n") == 0 and "model.layers.12" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("config", "split", "tied"),
    [("llama-tiny", "model.layers.1", ()), ("gpt2-tiny", "transformer.h.1", ("lm_head.weight",))],
)
def test_hf_model_split_by_block_name_pipelines(config: str, split: str, tied: tuple[str, ...]) -> None:
    """A Hugging Face model split before its second block: two stages (GPT-2's tied embedding
    and head on both, replicated); pipelined and tensor-parallel training equals the
    sequential step."""
    pytest.importorskip("transformers")
    from pathlib import Path

    from distir.frontends.torch_import.source import load
    from distir.frontends.torch_import.stages import StageSpec

    path = Path(__file__).parent / "configs" / f"{config}.json"
    model = load(f"hf:{path}", 4, DType.f64, StageSpec((split,)))
    assert [c.callee for c in model.layers] == ["stage0", "stage1", "loss"]
    assert model.tied == tied
    cmp = check_against_sequential(model, parse_strategy("d1.t2.p2.k2.1f1b"))
    assert cmp.max_rel_diff < 1e-9, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"


class MarkerAtTheEnd(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(D, D)

    def forward(self, x: Any) -> Any:
        x = self.lin(x)
        distir.pipe_split()
        return x


def test_marker_after_the_last_op_is_an_empty_stage() -> None:
    with pytest.raises(SplitError, match="after the last op"):
        import_module(MarkerAtTheEnd(), (torch.randn(2, D),), batch=2)


def test_split_before_the_first_op_is_an_empty_stage() -> None:
    with pytest.raises(SplitError, match="stage 0 would be empty"):
        import_module(torch.nn.Sequential(torch.nn.Linear(D, D)), (torch.randn(2, D),), batch=2, split=("0",))


def test_pipe_split_is_a_no_op_when_run_eagerly() -> None:
    torch.manual_seed(0)
    m = PiPPyExample()
    x = torch.randn(3, D)
    torch.testing.assert_close(m(x), PiPPyExample.forward(_without_markers(m), x))


def _without_markers(m: PiPPyExample) -> PiPPyExample:
    m.markers = False
    return m


class TokenSkip(torch.nn.Module):
    """(batch, seq, hidden) activations with a skip connection from stage 0 to stage 2: the
    packed values are flattened to (batch, seq·hidden) and reshaped back."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(D, D) for _ in range(3))

    def forward(self, x: Any) -> Any:
        h = self.a(x)
        distir.pipe_split()
        g = torch.relu(self.b(h))
        distir.pipe_split()
        return self.c(g + h)


def test_packed_sequence_activations_match_torch_and_pipeline() -> None:
    import numpy as np

    from distir.autodiff.train import Optimizer, training_step
    from distir.frontends.torch_import import weight_values
    from distir.interp.reference import run_reference

    torch.manual_seed(0)
    module = TokenSkip().double()
    x = torch.randn(4, 3, D, dtype=torch.float64)
    labels = torch.randint(0, D, (4, 3))
    model = import_module(module, (x,), batch=4, dtype=DType.f64)
    assert model.seq_dim is None  # a packed (batch, n) activation has no sequence dim
    assert "Reshape(%slice, shape=[0, 3, 4])" in print_function(model.module["stage2"])
    vals = {model.inputs[0].name: x.numpy(), "labels": labels.numpy(), **weight_values(model, module)}
    step = training_step(model, Optimizer("sgd", lr=1.0))
    out = run_reference(step, [vals[p.name] for p in step.entry.params])
    loss = torch.nn.functional.cross_entropy(module(x).reshape(-1, D), labels.reshape(-1))
    assert float(out[0]) == pytest.approx(loss.item(), rel=1e-12)
    np.testing.assert_equal(len(out), 1 + len(model.weights))
    cmp = check_against_sequential(model, parse_strategy("d1.t1.p3.k2.1f1b"))
    assert cmp.max_rel_diff < 1e-12, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"
