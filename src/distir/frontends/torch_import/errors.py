"""The importer's errors: each a ``ModelError`` (so every command that takes ``--model`` reports
it as one line, exit status 2) naming what failed and where."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from distir.frontends.zoo.model import ModelError


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first non-empty line of ``e``'s message, cut to ``limit`` characters (a library's
    message can list hundreds of names on one line)."""
    line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


class ImportFailure(ModelError):
    """A model could not be imported (the base of the importer's errors)."""


class SourceError(ImportFailure):
    """A model source that does not resolve: a missing file, a config that is not a model, a
    ``package.module:factory`` that does not exist or returns something else."""


class TraceError(ImportFailure):
    """torch.export could not trace the module (data-dependent control flow, unsupported
    Python, ...): the first line of torch's reason."""


class UnsupportedOpsError(ImportFailure):
    """The traced program uses ATen ops with no registry mapping: every one, with its count and
    the source location of its first use (never a partial import)."""

    def __init__(self, ops: Mapping[str, Sequence[str]]) -> None:
        self.ops = dict(ops)
        items = [f"{name} ×{len(where)} (at {where[0]})" for name, where in sorted(self.ops.items())]
        super().__init__(f"unsupported ops ({len(items)}): " + "; ".join(items))


class StructureError(ImportFailure):
    """The traced program does not fit the model contract (a value crossing two blocks, a
    shape that depends on the batch in a way a layer cannot express, ...)."""
