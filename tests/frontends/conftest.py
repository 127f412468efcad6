"""The 2-layer GPT-2 exports (static and dynamic) shared by the ONNX tests: session fixtures,
exported once per pytest process. Under pytest-xdist (``--dist loadgroup``) the tests that use
them carry ``xdist_group(ONNX_GPT2)``, so one worker exports them, not each worker; the tests read
the files and the torch model and change neither (the training test's ``backward`` writes only
gradients, zeroed first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .onnx_exports import export_gpt2

ONNX_GPT2 = "onnx-gpt2"


@pytest.fixture(scope="session")
def gpt2_with_torch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The static export and the torch model it came from."""
    return export_gpt2(tmp_path_factory.mktemp("onnx") / "gpt2_t.onnx", dynamic=False)


@pytest.fixture(scope="session")
def gpt2_onnx(gpt2_with_torch: tuple[Path, Any]) -> Path:
    """Static shapes: the exporter folds the sizes (batch 2, seq 8) into constants (the file of
    ``gpt2_with_torch``: one export for both)."""
    return gpt2_with_torch[0]


@pytest.fixture(scope="session")
def gpt2_dynamic_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Dynamic batch and sequence: sizes flow through Shape subgraphs (Figure 4 at scale) and
    the causal mask is computed from them (Range, GatherND, CumSum, comparisons)."""
    return export_gpt2(tmp_path_factory.mktemp("onnx") / "gpt2_dyn.onnx", dynamic=True)[0]
