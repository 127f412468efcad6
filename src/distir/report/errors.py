"""Turn distir's typed errors into one user-facing message: ``FILE:LINE:COL: what is wrong``.

Parse errors carry their own position; verifier and interpreter errors name an op or value,
which the parser's position table locates in the file.
"""

from __future__ import annotations

from collections.abc import Mapping

from distir.interp.lockstep import DeadlockError
from distir.interp.loop import InterpretError
from distir.interp.project import ProjectionError
from distir.ir.function import ModuleError
from distir.ir.parser import ParseError
from distir.ir.verify import VerifyError
from distir.ops.registry import RegistryError

USER_ERRORS = (
    ParseError,
    VerifyError,
    InterpretError,
    DeadlockError,
    ProjectionError,
    ModuleError,
    RegistryError,
)


def locate(err: BaseException, filename: str, positions: Mapping[object, tuple[int, int]]) -> str:
    """The message for ``err`` prefixed by where in ``filename`` it happened (when known)."""
    if isinstance(err, ParseError):
        return str(err)
    where: object = None
    if isinstance(err, VerifyError):
        where = err.op if err.op is not None else err.value
    elif isinstance(err, InterpretError):
        where = err.instrs[0] if err.instrs else err.value
    pos = positions.get(where) if where is not None else None
    if pos is not None:
        return f"{filename}:{pos[0]}:{pos[1]}: {err}"
    return f"{filename}: {err}"
