"""distir: an explicit IR for distributed neural-network computation, its interpreters
(types/shapes, reference executor, placement, per-rank projection) and, in later layers,
a simulator, transforms and a strategy search.

The convenience functions here wire the IR to the op registry:

    m = distir.load("examples/fig2_mlp_pipeline.distir")   # parse a file
    distir.verify(m)                                       # structure + op signatures
    typed = distir.check(m)                                # verify + infer types, annotated copy

and the strategy API (``distir.api``, imported on first use):

    found = distir.search(model="gpt2-1.6b", cluster="dgx-a100:2", batch=512)
    one = distir.simulate(model="gpt2-1.6b", strategy="d4.t4.p1.k8.1f1b", cluster="dgx-a100:2", batch=512)
    program = distir.distribute("gpt2-117m", "d2.t2.p2.k4.1f1b", batch=32)
    cluster = distir.Cluster.parse("dgx-a100:4")
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distir import ops as _ops  # registers every op
from distir import search  # a package, and callable: distir.search(...) is distir.api.search
from distir.interp.annotate import annotate_types
from distir.ir import Module, parse_module
from distir.ir.verify import verify as _verify

REGISTRY = _ops.REGISTRY
__version__ = "0.1.0"


def verify(module: Module) -> Module:
    """Check structure (SSA, calls) and every op against the registry; returns ``module``."""
    return _verify(module, REGISTRY.check_op)


def check(module: Module, concrete: Mapping[str, Any] | None = None) -> Module:
    """Verify, then type-check from the entry's parameter types; returns an annotated copy."""
    verify(module)
    return verify(annotate_types(module, concrete))


def load(path: str | Path) -> Module:
    """Parse a ``.distir`` file (raises ``ParseError`` with file:line:col on bad text)."""
    p = Path(path)
    return parse_module(p.read_text(encoding="utf-8"), str(path))


def pipe_split() -> None:
    """A pipeline stage boundary inside an ``nn.Module``'s ``forward`` (PiPPy's ``pipe_split``):
    the PyTorch importer splits the model into stages there (a no-op when run eagerly; torch is
    imported on first call). See ``distir.frontends.torch_import.stages``."""
    from distir.frontends.torch_import.markers import pipe_split as marker

    marker()


_API = ("Cluster", "Result", "SearchResults", "distribute", "simulate")

if TYPE_CHECKING:
    from distir.api import Cluster, Result, SearchResults, distribute, simulate


def __getattr__(name: str) -> Any:
    """The strategy API (``distir.api``), imported on first use."""
    if name in _API:
        from distir import api

        return getattr(api, name)
    raise AttributeError(f"module 'distir' has no attribute {name!r}")


__all__ = [
    "REGISTRY",
    "Cluster",
    "Result",
    "SearchResults",
    "annotate_types",
    "check",
    "distribute",
    "load",
    "search",
    "simulate",
    "verify",
]
