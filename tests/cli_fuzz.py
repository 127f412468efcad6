"""The CLI fuzzer shared by ``tests/test_cli_fuzz.py`` (a bounded run in CI) and
``bench/bench_fuzz.py`` (a longer one): hypothesis strategies of command lines, and
``run_cli``, which runs one command line in a forked child of this process under a time and
memory bound and classifies what happened.

The contract checked (``Outcome.clean``): every command line either works (exit 0) or is a user
error (exit 2 with exactly one line on stderr), never a traceback, never past the time bound and
never past the memory bound (a ``MemoryError`` is a traceback).

A forked child starts at once (distir is already imported) and keeps the parent clean: its
caches, ``sys.path`` and working directory changes die with it. Each child runs with
``RLIMIT_AS`` at its parent's size plus ``memory_bytes`` and is killed at ``timeout_s``.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import NamedTuple

from hypothesis import strategies as st

import distir.cli  # noqa: F401  imported once here, not in every forked child

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "src" / "distir" / "examples"
CLUSTER_TOML = EXAMPLES / "clusters" / "amp_hetero.toml"
PROGRAMS = sorted(EXAMPLES.glob("*.distir"))
TINY = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"
_IN_FILE = re.compile(r"^\S+\.distir(:\d+:\d+)?: ")
CRASH = 99  # the child's exit status for an exception that escaped ``main``


class Outcome(NamedTuple):
    argv: tuple[str, ...]
    code: int | None  # None: killed at the time bound
    stdout: str
    stderr: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.code is None

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr or self.code not in (None, 0, 2)

    @property
    def clean(self) -> bool:
        """Worked, or a one-line user error (exit 2); no traceback, not killed. An error in a
        program file (``FILE[:LINE:COL]: message``) may go on with indented context lines: the
        quoted line with a caret under the spot, the calls it was reached through."""
        if self.timed_out or self.traceback:
            return False
        if self.code == 0:
            return True
        lines = self.stderr.rstrip().splitlines()
        if not lines or not lines[0].strip():
            return False
        context = all(line[:1].isspace() for line in lines[1:])
        return len(lines) == 1 or (_IN_FILE.match(lines[0]) is not None and context)

    def describe(self) -> str:
        what = "timed out" if self.timed_out else f"exit {self.code}"
        tail = "\n".join(self.stderr.strip().splitlines()[-12:])
        return f"distir {' '.join(map(repr, self.argv))}: {what} after {self.seconds:.1f} s\n{tail}"


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _child(argv: list[str], out_fd: int, err_fd: int, memory_bytes: int, cwd: str) -> None:
    """In the forked child: bound memory, run ``main``, exit with its status; never returns."""
    code = CRASH
    try:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        # pytest's capture replaces sys.stdout/err by objects that do not write to fds 1 and 2
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        os.chdir(cwd)
        limit = _vm_bytes() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from distir.cli import main

        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = CRASH
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_cli(
    argv: list[str], timeout_s: float = 30.0, memory_bytes: int = 3 << 30, cwd: str | Path | None = None
) -> Outcome:
    """Run ``distir argv`` in a forked child (module docstring) and say what happened."""
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            _child(argv, out_f.fileno(), err_f.fileno(), memory_bytes, str(cwd or os.getcwd()))
        code: int | None = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                if code < 0:  # killed by a signal (the kernel's OOM killer, a segfault)
                    code = 128 - code
                break
            if time.monotonic() - t0 > timeout_s:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        seconds = time.monotonic() - t0
        out_f.seek(0)
        err_f.seek(0)
        stdout = out_f.read().decode("utf-8", "replace")
        stderr = err_f.read().decode("utf-8", "replace")
    return Outcome(tuple(argv), code, stdout, stderr, seconds)


# --- inputs --------------------------------------------------------------------------------

# numbers: small and valid, zero and negative, huge, non-ASCII digits, not numbers at all
NUMBERS = st.one_of(
    st.integers(1, 8).map(str),
    st.sampled_from(
        ["0", "-1", "1e9", "99999999999999999999", "10000", "1000000000", "²", "٢", "½", "", "x"]
    ),
    st.text(alphabet="0123456789²٢۳𝟚", min_size=1, max_size=4),
)
SMALL = st.integers(1, 8).map(str)

_STRATEGY_PARTS = st.one_of(
    st.builds("d{}".format, NUMBERS),
    st.builds("t{}".format, NUMBERS),
    st.builds("p{}".format, NUMBERS),
    st.builds("k{}".format, NUMBERS),
    st.builds("v{}".format, NUMBERS),
    st.builds("c{}".format, NUMBERS),
    st.builds("z{}".format, NUMBERS),
    st.builds("z3h{}".format, NUMBERS),
    st.builds("L{}-{}".format, NUMBERS, NUMBERS),
    st.builds("b{}-{}".format, NUMBERS, NUMBERS),
    st.builds("@{}-{}".format, NUMBERS, NUMBERS),
    st.sampled_from(
        ["1f1b", "gpipe", "interleaved", "zb1", "sp", "rops", "rsel", "rfull", "rnone", "Lparams"]
    ),
    st.text(max_size=4),
)
STRATEGIES = st.one_of(
    st.lists(_STRATEGY_PARTS, min_size=0, max_size=6).map(".".join),
    st.sampled_from(["d1.t1.p1.k1", "d2.t1.p1.k1", "d1.t2.p1.k1", "d1.t1.p2.k2.1f1b", "d2.t2.sp.p1.k1.z1"]),
)

_MODEL_KEYS = st.sampled_from(["layers", "hidden", "heads", "seq", "vocab", "ffn", "dropout", "bogus", ""])
MODELS = st.one_of(
    st.just(TINY),
    st.builds(
        lambda kv: "gpt:" + ",".join(f"{k}={v}" for k, v in kv),
        st.lists(st.tuples(_MODEL_KEYS, NUMBERS), max_size=4),
    ),
    st.sampled_from(["gpt2-117m", "mlp", "llama:layers=2,hidden=64,heads=4,seq=16,vocab=128", "nosuch", ""]),
    st.sampled_from(["hf:/no/such/config.json", "hf:", "no.such.module:factory", "os:getcwd", "gpt:"]),
    st.text(alphabet=st.characters(blacklist_characters=":"), max_size=12),  # no module:factory
)

CLUSTERS = st.one_of(
    st.sampled_from(
        ["dgx-a100", "p3.8xlarge", "dgx-a100:2", "p3.8xlarge:1+g4dn.12xlarge:1", "h100", "local-cpu"]
    ),
    st.builds("dgx-a100:{}".format, NUMBERS),
    st.builds("p3.8xlarge:{}+g4dn.12xlarge:{}".format, NUMBERS, NUMBERS),
    st.just(str(CLUSTER_TOML)),
    st.sampled_from(["", "+", "nosuch", "dgx-a100:", ":1", "/no/such.toml"]),
    st.text(max_size=10),
)

# small TOML cluster files: the example with one value replaced, or a few fields from scratch
_TOML_KEYS = st.sampled_from(
    ["count", "devices_per_node", "memory_gib", "fp32_tflops", "intra_latency_us", "inter_bandwidth_gb_s"]
)
_TOML_VALUES = st.one_of(
    st.sampled_from(["1", "0", "-1", "1e9", "100000000", "nan", "inf", '"x"', "[]", "{}", "true", "1.5"]),
    st.integers(-(10**30), 10**30).map(str),
)
TOML_TEXTS = st.one_of(
    st.builds(
        lambda key, value: _replace_toml(CLUSTER_TOML.read_text(), key, value),
        _TOML_KEYS,
        _TOML_VALUES,
    ),
    st.builds(
        lambda n, d, mem: f'name = "x"\n[[nodes]]\npreset = "dgx-a100"\ncount = {n}\n[types]\n# {d} {mem}\n',
        _TOML_VALUES,
        _TOML_VALUES,
        _TOML_VALUES,
    ),
    st.text(max_size=40),
)


def _replace_toml(text: str, key: str, value: str) -> str:
    """``text`` with the first ``key = ...`` line's value replaced by ``value``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split("=")[0].strip() == key:
            lines[i] = f"{key} = {value}"
            break
    return "\n".join(lines) + "\n"


# output paths (made concrete under a scratch directory by ``concrete_path``)
PATH_KINDS = st.sampled_from(
    ["file", "new-dir/file", "dir", "file-as-dir/x", "missing/deep/x", "symlink", "dangling", "", ".", "/"]
)


def concrete_path(kind: str, scratch: Path, suffix: str) -> str:
    """A path of ``kind`` under ``scratch`` (created as needed)."""
    scratch.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        (scratch / "a-dir").mkdir(exist_ok=True)
        return str(scratch / "a-dir")
    if kind == "file-as-dir/x":
        (scratch / "a-file").write_text("x")
        return str(scratch / "a-file" / f"x{suffix}")
    if kind == "symlink":
        target = scratch / f"target{suffix}"
        target.write_text("old")
        link = scratch / f"link{suffix}"
        if not link.is_symlink():
            link.symlink_to(target)
        return str(link)
    if kind == "dangling":
        link = scratch / f"dangling{suffix}"
        if not link.is_symlink():
            link.symlink_to(scratch / "nowhere" / "x")
        return str(link)
    if kind in ("", ".", "/"):
        return kind
    return str(scratch / f"{kind}{suffix}")


def mutated_program(text: str, seed: int, value: str) -> str:
    """``text`` with its ``seed % n``-th integer literal replaced by ``value``."""
    spots = [m.span() for m in re.finditer(r"\b\d+\b", text)]
    if not spots:
        return text
    a, b = spots[seed % len(spots)]
    return text[:a] + value + text[b:]


__all__ = [
    "CLUSTERS",
    "MODELS",
    "NUMBERS",
    "PATH_KINDS",
    "PROGRAMS",
    "SMALL",
    "STRATEGIES",
    "TINY",
    "TOML_TEXTS",
    "Outcome",
    "concrete_path",
    "mutated_program",
    "run_cli",
]
