"""Replacing a report file atomically: a reader sees the old file or the whole new one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    # os.umask can only be read by setting it, which races with other threads creating files;
    # Linux publishes it in /proc. Elsewhere assume the common default.
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def write_atomically(path: Path, data: bytes) -> Path:
    """Replace ``path`` by ``data`` so that a reader sees the old file or the whole new one.

    The bytes go to a fresh, uniquely named temporary file in the same directory (so that
    ``os.replace`` is a rename on one filesystem), which is removed if anything fails. The new
    file keeps an existing file's permissions, else gets the usual ``0o666 & ~umask`` (mkstemp
    would leave it private). The parent directory must exist. Returns ``path``.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
