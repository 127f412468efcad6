"""``distir.files``: atomic writes (unique temporary in the target's directory, never through a
symlink) and output paths checked before any work."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from distir.files import OutputPathError, check_output, write_atomically


def test_write_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    write_atomically(path, "old\n")
    write_atomically(path, "new\n")
    assert path.read_text() == "new\n" and os.listdir(tmp_path) == ["out.csv"]
    write_atomically(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"


def test_write_keeps_the_mode_and_creates_missing_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.html"
    write_atomically(path, "x")
    path.chmod(0o640)
    write_atomically(path, "y")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_text() == "y"


def test_a_symlink_is_replaced_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "out.csv"
    link.symlink_to(victim)
    # the old writer's fixed "<path>.tmp", planted as a link to the victim, is not used either
    (tmp_path / "out.csv.tmp").symlink_to(victim)
    write_atomically(link, "new")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a-dir"
    target.mkdir()
    (target / "inside").write_text("x")
    with pytest.raises(OSError):
        write_atomically(target, "x")  # os.replace cannot put a file over a non-empty directory
    assert sorted(os.listdir(tmp_path)) == ["a-dir"]


def test_two_writers_never_share_a_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each write makes its own temporary (mkstemp, O_EXCL): a leftover of another run is not
    reused or clobbered."""
    seen: list[str] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(os.path.basename(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_atomically(tmp_path / "t.json", "1")
    write_atomically(tmp_path / "t.json", "2")
    assert len(set(seen)) == 2 and all(s.startswith(".t.json.") for s in seen)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d, "is a directory"),
        (lambda d: (d / "f").write_text("x") and d / "f" / "out.csv", "is not a directory"),
        (lambda d: Path(""), "not a file name"),
        (lambda d: d / "..", "not a file name"),
    ],
)
def test_check_output_refuses_in_one_line(tmp_path: Path, make: object, message: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(OutputPathError, match=message) as got:
        check_output(path, "--csv")
    assert "\n" not in str(got.value) and str(got.value).startswith("--csv ")


def test_check_output_accepts_missing_directories_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "out.png"
    assert check_output(path, "--plot") == path
    assert os.listdir(tmp_path) == []


def test_check_output_refuses_an_unwritable_directory_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unwritable as the kernel says (``os.access``; root writes anywhere, so it is faked)."""
    (tmp_path / "exists.csv").write_text("x")
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(OutputPathError, match="not writable"):
        check_output(tmp_path / "new" / "out.csv", "--csv")
    with pytest.raises(OutputPathError, match="the file is not writable"):
        check_output(tmp_path / "exists.csv", "--csv")


def test_chunks_are_written_as_produced_and_a_failing_producer_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_atomically(target, iter(["[", "1,", "2", "]"]))
    assert target.read_text() == "[1,2]"

    def broken() -> Iterator[str]:
        yield "partial"
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError, match="producer failed"):
        write_atomically(target, broken())
    assert target.read_text() == "[1,2]"
    assert sorted(os.listdir(tmp_path)) == ["out.json"]


def test_a_pipe_or_device_is_written_through_never_replaced(tmp_path: Path) -> None:
    """``--trace /dev/null`` (or a named pipe) gets the bytes; renaming a file over it would
    replace the device node or the pipe with a regular file (as root, /dev/null itself). The test
    uses a pipe of its own: a broken writer must not be able to replace the system's /dev/null."""
    import threading

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert check_output(fifo, "--trace") == fifo
    write_atomically(fifo, iter(["[1,", "2]"]))
    reader.join(timeout=30)
    assert got == [b"[1,2]"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["out.fifo"]  # no temporary left beside it


def test_two_outputs_naming_one_file_are_refused(tmp_path: Path) -> None:
    """``--csv x --html x``: the second write would replace the first silently (or a CSV the
    user's result store); however spelled, one line naming both options. A device takes both."""
    from distir.files import check_distinct

    (tmp_path / "sub").mkdir()
    same = {"--csv": tmp_path / "out", "--html": tmp_path / "sub" / ".." / "out", "--plot": None}
    with pytest.raises(OutputPathError, match=r"--csv .* and --html .* name the same file") as got:
        check_distinct(same)
    assert "\n" not in str(got.value)
    check_distinct({"--csv": tmp_path / "a", "--html": tmp_path / "b"})
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    check_distinct({"--csv": fifo, "--html": fifo})


def test_the_systems_aliases_of_open_files_are_written_through() -> None:
    """``--csv /dev/stdout`` (a symlink in /dev to /proc/self/fd/1) is the process's output, not a
    link to replace: renamed over, it would replace /dev/stdout itself (as root, for everyone).
    Only the predicate is tested: a regression must not be able to replace the system's link."""
    from distir.files import _is_stream

    for alias in ("/dev/stdout", "/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"):
        if os.path.lexists(alias):
            assert _is_stream(Path(alias)), alias
    assert not _is_stream(Path("/etc/hostname"))


def test_a_write_the_check_could_not_foresee_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``/dev/full`` passes ``check_output`` (a writable device) and fails on the write: an
    ``OutputWriteError`` (an ``OSError`` too) naming the path, and ``distir`` ends in that one
    line, exit 2, not a traceback."""
    from distir.cli import main
    from distir.files import OutputWriteError

    with pytest.raises(OutputWriteError, match=r"^/dev/full: cannot write it: No space left on device$"):
        write_atomically("/dev/full", "x")
    assert issubclass(OutputWriteError, OSError)
    argv = ["export", "--to", "megatron", "--model", "gpt2-117m:layers=2", "--strategy", "d1", "--batch", "8"]
    with pytest.raises(SystemExit) as got:
        main([*argv, "--out", "/dev/full"])
    assert got.value.code == 2
    assert capsys.readouterr().err.strip() == "/dev/full: cannot write it: No space left on device"
