"""A weight every block reads, on more than two pipeline stages (``distribute._tied_copies``'
groups): each stage keeps a copy, the copies' gradients are summed on the weight's first stage
and the sum sent back, so every copy takes the same step; the distributed steps equal the
sequential one. The model is a PyTorch MLP whose blocks share one gain vector, exported to ONNX
(the import passes the shared weight to every block)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from distir.frontends.files import load_file
from distir.parallel.check import check_against_sequential
from distir.parallel.strategy import parse_strategy


@pytest.fixture(scope="module")
def shared_gain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    torch.set_num_threads(1)
    torch.manual_seed(2)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x: Any, gain: Any) -> Any:
            return x + torch.relu(self.fc(x * gain))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(8, 16)
            self.gain = torch.nn.Parameter(1.0 + 0.1 * torch.randn(16))
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
            self.out = torch.nn.Linear(16, 4)

        def forward(self, x: Any) -> Any:
            h = self.inp(x)
            for b in self.blocks:
                h = b(h, self.gain)
            return self.out(h)

    path = tmp_path_factory.mktemp("onnx") / "shared_gain.onnx"
    torch.onnx.export(
        Net().eval(),
        (torch.randn(2, 8),),
        str(path),
        dynamo=True,
        input_names=["x"],
        external_data=False,
        dynamic_shapes=({0: torch.export.Dim("n")},),
    )
    return path


@pytest.mark.xdist_group("tied-stages")
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["d1.t1.p3.k2.1f1b", "d2.t1.p3.k2.1f1b", "d1.t1.p3.k4.gpipe"])
def test_a_weight_on_three_stages_takes_one_step_on_each_equal_to_the_sequential_one(
    shared_gain: Path, strategy: str
) -> None:
    model = load_file(str(shared_gain), 8)
    assert any("gain" in name for name in model.tied), model.tied
    cmp = check_against_sequential(model, parse_strategy(strategy))
    assert cmp.max_rel_diff < 1e-4, f"{cmp.worst} differs by {cmp.max_rel_diff:.2e}"
    gains = [n for n, r in cmp.results.items() if r[0] == "weight" and "gain" in n]
    assert gains, "the shared weight's updated copies are compared"
