"""Output files: checked before any work, written atomically.

Every file distir writes (CSV, HTML, PNG, traces, profile TOML, exported configurations) goes
through ``write_atomically``: the bytes go to a fresh, uniquely named temporary file in the
target's directory (created with ``O_EXCL``, so it never follows a symlink nor collides with
another run), are synced, and ``os.replace`` renames it over the target. A reader sees the old
file or the whole new one; a failed write leaves the old file untouched and no temporary behind.
A target that is a symlink is replaced by the new file (the link's target is never written).
A target that is a character device or a named pipe (``/dev/null``, a FIFO), or the system's
alias of an open file (a symlink in ``/dev`` or ``/proc``: ``/dev/stdout``), is written straight
through: renaming a file over it would replace the device node, the pipe or the alias (as root,
the system's ``/dev/null``), and none has old contents to keep.

``check_output(path, option)`` is what commands call on every output path *before* any work,
so a bad path fails in a second with one line instead of after a long search: the path must not
be a directory, its nearest existing ancestor must be a writable directory (the missing
directories are created when written), and an existing file must be writable.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["OutputPathError", "OutputWriteError", "check_distinct", "check_output", "write_atomically"]


class OutputPathError(Exception):
    """An output path that cannot be written; the message names the option and the path."""


class OutputWriteError(OutputPathError, OSError):
    """Writing an output failed where ``check_output`` could not tell beforehand (a file system
    that takes no new files, such as ``/proc``; a full disk): the message names the path and
    the system's reason. An ``OSError`` too, for the callers that catch those."""


def _umask() -> int:
    # os.umask can only be read by setting it, which races with other threads creating files;
    # Linux publishes it in /proc. Elsewhere assume the common default.
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _nearest_existing(path: Path) -> Path:
    """``path``'s nearest ancestor that exists (``path`` is absolute)."""
    for parent in path.parents:
        if os.path.lexists(parent):
            return parent
    return Path(path.anchor)


def check_output(path: Path | str, option: str) -> Path:
    """``path`` as given, if a file can be written there; else ``OutputPathError`` in one line
    naming ``option`` (e.g. ``--csv``) and what is wrong. Creates nothing."""
    p = Path(path)
    where = f"{option} {p}" if option else str(p)
    if str(p) == "" or p.name in ("", ".", ".."):
        raise OutputPathError(f"{where}: not a file name")
    full = Path(os.path.abspath(p))
    try:
        if full.is_dir():
            raise OutputPathError(f"{where}: is a directory; give a file name")
        if os.path.lexists(full):
            if not os.access(full, os.W_OK):
                raise OutputPathError(f"{where}: the file is not writable")
            parent = full.parent
        else:
            parent = _nearest_existing(full)
        if not parent.is_dir():
            raise OutputPathError(f"{where}: {parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputPathError(f"{where}: cannot create files in {parent} (not writable)")
    except OSError as exc:  # a name too long, a loop of symlinks, ...
        raise OutputPathError(f"{where}: {exc.strerror or exc}") from exc
    return p


def _is_stream(path: Path) -> bool:
    """``path`` is written through, not replaced: a character device or a named pipe, or one of
    the system's aliases of an open file (a symlink in ``/dev`` or ``/proc``: ``/dev/stdout``,
    ``/dev/fd/N``), which a rename would replace for every process."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    if stat.S_ISLNK(mode):
        parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        return parent == "/dev" or parent.startswith(("/dev/", "/proc/"))
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_distinct(
    paths: Mapping[str, Path | str | None], reads: Mapping[str, Path | str | None] | None = None
) -> None:
    """``OutputPathError`` when two of a command's outputs (option → path; None: not written)
    name one file, however spelled: the later write would replace the earlier one silently; or
    when an output names a file the command reads (``reads``, e.g. ``{"--model": config}``). A
    character device or a named pipe (``/dev/null``) may take several."""
    inputs = {os.path.realpath(os.path.abspath(p)): (o, p) for o, p in (reads or {}).items() if p is not None}
    seen: dict[str, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        full = os.path.realpath(os.path.abspath(path))
        if _is_stream(Path(full)):
            continue
        if full in inputs:
            given, read = inputs[full]
            raise OutputPathError(
                f"{option} {path} is the file {given} reads ({read}): refusing to overwrite it"
            )
        if full in seen:
            first = seen[full]
            raise OutputPathError(
                f"{first} {paths[first]} and {option} {path} name the same file: give each its own"
            )
        seen[full] = option


def write_atomically(path: Path | str, data: bytes | str | Iterable[str]) -> Path:
    """Replace ``path`` by ``data`` (``str`` is written as UTF-8; an iterable of ``str``, chunk by
    chunk, as it is produced) so that a reader sees the old file or the whole new one (module
    docstring); creates missing parent directories. The new file keeps an existing file's
    permissions, else gets the usual ``0o666 & ~umask`` (a ``mkstemp`` file would stay private).
    Returns ``path``; ``OutputWriteError`` (an ``OSError``) if it cannot be written (or what
    producing a chunk raises)."""
    try:
        return _write_atomically(Path(path), data)
    except OutputPathError:
        raise
    except OSError as exc:
        raise OutputWriteError(f"{path}: cannot write it: {exc.strerror or exc}") from exc


def _write_atomically(path: Path, data: bytes | str | Iterable[str]) -> Path:
    """``write_atomically``, its ``OSError`` as the system raises it."""
    chunks = [data] if isinstance(data, (str, bytes)) else data
    if _is_stream(path):
        with open(path, "wb") as f:  # an existing device or pipe: O_CREAT never applies
            for chunk in chunks:
                f.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
