"""Issue 22 (part B): inputs that ran for minutes, ate gigabytes or ended in a traceback now end
in one line on stderr and exit status 2, before any program is built.

The unbounded cases run through ``distir.cli.main`` (the console script) in one child process
under a memory limit (``RLIMIT_AS``) and a wall-clock timeout; each case's CPU time is bounded
too. Before the fix each of them ran past those bounds or raised MemoryError/OverflowError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distir.cli import _non_ascii_number, main

EX = Path(__file__).resolve().parents[1] / "examples"
SRC = Path(__file__).resolve().parents[1] / "src"
MEMORY_LIMIT = 3 * 2**30  # address space of the child: numpy and the CLI need ~1 GiB
CASE_CPU_S = 20.0  # per case; a bound on runaway work (each case takes well under 2 s)
TIMEOUT_S = 300.0  # the whole batch, on a loaded machine

_CHILD = textwrap.dedent(
    """
    import contextlib, io, json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    from distir.cli import main
    out = []
    for argv in json.loads(sys.stdin.read()):
        sys.argv = ["distir", *argv]
        err = io.StringIO()
        t0 = time.process_time()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code
            except BaseException as e:  # a traceback: reported, the test fails on it
                code = repr(e)
        out.append([code, err.getvalue(), time.process_time() - t0])
    print(json.dumps(out))
    """
)


def run_bounded(cases: list[list[str]]) -> list[tuple[object, str, float]]:
    """Run ``distir ARGS`` for each case in one child under the memory and time bounds."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(limit=MEMORY_LIMIT)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [tuple(r) for r in json.loads(proc.stdout.splitlines()[-1])]


def _toml(tmp: Path, name: str, text: str) -> str:
    p = tmp / name
    p.write_text(text, encoding="utf-8")
    return str(p)


@pytest.mark.slow
def test_unbounded_inputs_end_in_one_line_before_any_work(tmp_path: Path) -> None:
    program = EX / "mlp_sequential.distir"
    big = _toml(
        tmp_path,
        "big.distir",
        "func @main(%x: Tensor[f32, (100000, 100000), d0]) {\n  %y = Relu(%x)\n  return %y\n}\n",
    )
    dpn = _toml(
        tmp_path,
        "dpn.toml",
        '[types.a]\npreset = "dgx-a100"\ndevices_per_node = 100000000\n[[nodes]]\ntype = "a"\n',
    )
    count = _toml(tmp_path, "count.toml", '[[nodes]]\ntype = "dgx-a100"\ncount = 1000000000\n')
    count_float = _toml(tmp_path, "countf.toml", '[[nodes]]\ntype = "dgx-a100"\ncount = 1e9\n')
    cases = {
        "search --workers 10000": (
            ["search", "--workers", "10000", "--model", "gpt2-117m", "--batch", "8", "--fresh"],
            "--workers 10,000",
        ),
        "--strategy d999999999": (
            ["simulate", "--model", "gpt2-117m", "--strategy", "d999999999"],
            "d = 999,999,999",
        ),
        "--strategy d9999 (more GPUs than the cluster)": (
            ["simulate", "--model", "gpt2-117m", "--strategy", "d9999"],
            "needs 9,999 GPUs but dgx2-v100 has 16",
        ),
        "--strategy k100000": (["simulate", "--model", "gpt2-117m", "--strategy", "k100000"], "k = 100,000"),
        "--strategy k50000 (estimated ops)": (
            ["simulate", "--model", "gpt2-117m", "--strategy", "k50000", "--batch", "50000"],
            "about 83,400,000 ops",
        ),
        "gpt:layers=1000000000000": (
            ["simulate", "--model", "gpt:layers=1000000000000"],
            "layers = 1,000,000,000,000",
        ),
        "huge widths (tensor elements)": (
            [
                "simulate",
                *("--model", "gpt:layers=2,hidden=16777216,heads=1,seq=16777216,vocab=16777216"),
                *("--batch", "16777216"),
            ],
            "is above distir's bound of 9,007,199,254,740,992 elements in one tensor",
        ),
        "--batch 99999999999999999999": (
            ["simulate", "--model", "gpt2-117m", "--batch", "99999999999999999999"],
            "the batch = 99,999,999,999,999,999,999",
        ),
        "search --microbatches 50000": (
            ["search", "--model", "gpt2-117m", "--microbatches", "50000", "--batch", "50000", "--fresh"],
            "with k = 50,000 microbatches would have about 83,400,000 ops",
        ),
        "search --batch 99999999999999999999": (
            ["search", "--model", "gpt2-117m", "--batch", "99999999999999999999", "--fresh"],
            "--batch = 99,999,999,999,999,999,999",
        ),
        "shard --mesh tp=1000000000": (
            ["shard", "--mesh", "tp=1000000000", str(program)],
            "its size = 1,000,000,000",
        ),
        "shard --mesh tp=65536 (estimated size)": (
            ["shard", "--mesh", "tp=65536", str(program)],
            "op-device entries",
        ),
        "devices_per_node = 100000000": (["clusters", "--cluster", dpn], "GPUs per node = 100,000,000"),
        "count = 1000000000": (["clusters", "--cluster", count], "number of nodes = 1,000,000,000"),
        "count = 1e9": (["clusters", "--cluster", count_float], "expected a positive integer"),
        "cluster spec dgx-a100:100000000": (
            ["clusters", "--cluster", "dgx-a100:100000000"],
            "GPU count = 800,000,000",
        ),
        "exec of a (100000, 100000) tensor": (["exec", big], "above --max-gib 2"),
    }
    results = run_bounded([argv for argv, _ in cases.values()])
    for (name, (_, want)), (code, err, cpu) in zip(cases.items(), results, strict=True):
        assert code == 2, f"{name}: exit {code}, stderr {err[-500:]}"
        assert err.count("\n") == 1 and want in err, f"{name}: {err!r}"
        assert "Traceback" not in err and "Error:" not in err.split(":", 1)[0]
        assert cpu < CASE_CPU_S, f"{name}: {cpu:.1f} s of CPU"


def run_main(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    """``distir ARGV`` through the console script's ``main``: exit status and stderr."""
    monkeypatch.setattr(sys, "argv", ["distir", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["simulate", "--model", "gpt2-117m", "--batch", "0"], "'--batch'"),
        (["search", "--top", "0"], "'--top'"),
        (["search", "--zero", "4"], "'--zero'"),
        (["lower", "--rank", "-1", str(EX / "fig2_mlp_pipeline.distir")], "'--rank'"),
        (["exec", "--seed", "-1", str(EX / "fig2_mlp_pipeline.distir")], "'--seed'"),
        (["simulate", "--model", "gpt2-117m", "--strategy", ""], "empty strategy"),
        (["simulate", "--model", "gpt2-117m", "--clip-grad", "inf"], "--clip-grad must be a finite norm"),
        (["simulate", "--model", "gpt2-117m", "--clip-grad", "nan"], "'--clip-grad'"),
        (
            ["simulate", "--model", "gpt2-117m", "--dtype", "f64"],
            "--dtype must be auto, f32, bf16 or f16, got 'f64'",
        ),
        (["import", "gpt2-117m", "--dtype", "f64"], "--dtype must be f32, bf16 or f16, got 'f64'"),
        (["simulate", "--model", "gpt2-117m", "--device-map", "d0=0:bogus"], "unknown stream 'bogus'"),
        (["simulate", "--model", "gpt2-117m", "--strategy", "d²"], "unknown part 'd²'"),
        (["simulate", "--model", "gpt2-117m", "--strategy", "d٢"], "unknown part 'd٢'"),
        (["simulate", "--model", "gpt2-117m", "--batch", "٢"], "'٢' is not a number distir reads"),
        (["simulate", "--model", "gpt2-117m", "--batch=１２"], "'１２' is not a number distir reads"),
        (["shard", "--mesh", "tp=²", str(EX / "mlp_sequential.distir")], "not like tp=4"),
        (["simulate", "--model", "gpt:layers=٢"], "expected a positive integer"),
        (["calibrate", "--nproc", "100000"], "--nproc 100,000: one process per rank"),
        (["validate", "--nproc", "100000"], "--nproc 100,000: one process per rank"),
        (
            ["run", "--model", "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64", "--strategy", "d10000"],
            "has 10,000 ranks; a local run starts one process per rank",
        ),
    ],
)
def test_user_errors_are_one_line_exit_2(
    argv: list[str], want: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = run_main(argv, capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and want in err, err


def test_non_ascii_numbers_are_found_in_values_and_options() -> None:
    assert _non_ascii_number(["--batch", "٢"]) == "٢"
    assert _non_ascii_number(["--bucket-mb=١.٥"]) == "١.٥"
    assert _non_ascii_number(["--model", "gpt2-117m", "--batch", "8", "naïve.distir"]) is None


def test_a_bom_starts_a_program_and_a_cluster_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prog = tmp_path / "bom.distir"
    prog.write_bytes(b"\xef\xbb\xbf" + (EX / "mlp_sequential.distir").read_bytes())
    code, err = run_main(["show", str(prog)], capsys, monkeypatch)
    assert code == 0, err
    toml = tmp_path / "bom.toml"
    toml.write_bytes(b"\xef\xbb\xbf" + (EX / "clusters" / "amp_hetero.toml").read_bytes())
    code, err = run_main(["clusters", "--cluster", str(toml), "--json"], capsys, monkeypatch)
    assert code == 0, err


def test_exec_max_gib_guards_and_admits(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prog = str(EX / "fig2_mlp_pipeline.distir")
    code, err = run_main(["exec", prog, "--max-gib", "0"], capsys, monkeypatch)
    assert code == 2 and "above --max-gib 0" in err and err.count("\n") == 1
    code, err = run_main(["exec", prog], capsys, monkeypatch)
    assert code == 0, err


def test_simulate_max_ops_guards_and_admits(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = [
        "simulate",
        "--model",
        "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64",
        "--strategy",
        "d1.t1.p1.k2",
    ]
    code, err = run_main([*base, "--max-ops", "10"], capsys, monkeypatch)
    assert code == 2 and "above --max-ops 10" in err and err.count("\n") == 1
    code, err = run_main(base, capsys, monkeypatch)
    assert code == 0, err


def test_simulate_refuses_a_tensor_parallel_degree_that_splits_a_head() -> None:
    """12 heads over t = 8 (Megatron-Core's ``divide`` asserts): one line naming the model's
    sizes and the degrees that divide them, exit 2, before anything is built."""
    from typer.testing import CliRunner

    from distir.cli import app

    args = ["simulate", "--model", "gpt2-117m:layers=2", "--strategy", "d1.t8.p1.k1", "--cluster", "dgx-a100"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        "gpt2-117m:layers=2: t=8 does not divide heads=12: tensor parallelism gives each rank whole "
        "attention heads and FFN columns (t dividing them all: 1, 2, 3, 4, 6, 12)"
    )
