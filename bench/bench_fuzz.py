"""The CLI fuzzer, run for longer than CI runs it (issue 22).

The generators of ``tests/cli_fuzz.py`` (strategy, model and cluster strings, small TOML cluster
files, pins, output paths, mutated programs) over ``simulate``, ``search`` (tiny budgets),
``shard``, ``show``, ``lower``, ``exec``, ``clusters`` and ``import``; each command line in a
forked child under a time and memory bound (``cli_fuzz.run_cli``). Prints the inputs tried, the
clean outcomes (worked, or exit 2 with one line), tracebacks (must be 0) and time-outs (must be
0), and every offending command line with the end of its stderr.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/bench_fuzz.py [--examples N] [--timeout S] [--seed K]

``--examples`` is per family (default 200); exit status 1 if any traceback or time-out.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hypothesis
from hypothesis import strategies as st

from cli_fuzz import (
    CLUSTERS,
    MODELS,
    NUMBERS,
    PATH_KINDS,
    PROGRAMS,
    SMALL,
    STRATEGIES,
    TINY,
    TOML_TEXTS,
    Outcome,
    concrete_path,
    mutated_program,
    run_cli,
)


def _families(scratch: Path) -> dict[str, st.SearchStrategy[tuple[list[str], Path | None]]]:
    """Command-line generators by family: (argv, working directory)."""
    counter = iter(range(10**9))

    def fresh() -> Path:
        d = scratch / f"case{next(counter)}"
        d.mkdir()
        return d

    def toml(text: str, command: str) -> tuple[list[str], Path | None]:
        path = fresh() / "c.toml"
        path.write_text(text, encoding="utf-8")
        if command == "clusters":
            return ["clusters", "--cluster", str(path)], None
        return [
            "simulate",
            "--model",
            TINY,
            "--strategy",
            "d2.t1.p1.k1",
            "--batch",
            "8",
            "--cluster",
            str(path),
        ], None

    def program(
        prog: Path, spot: int, value: str, command: str, number: str
    ) -> tuple[list[str], Path | None]:
        path = fresh() / prog.name
        path.write_text(mutated_program(prog.read_text(), spot, value), encoding="utf-8")
        extra = {"lower": ["--rank", number], "exec": ["--seed", number]}.get(command, [])
        return [command, str(path), *extra], None

    def output(option: str, kind: str) -> tuple[list[str], Path | None]:
        d = fresh()
        path = concrete_path(kind, d, ".out")
        if option == "--trace":
            return [
                "simulate",
                "--model",
                TINY,
                "--strategy",
                "d2.t1.p1.k1",
                "--batch",
                "8",
                "--trace",
                path,
            ], d
        argv = ["search", "--model", TINY, "--cluster", "p3.8xlarge", "--batch", "8", "--top", "1"]
        argv += ["--store", str(d / "s.sqlite")] if option != "--store" else []
        argv += ["--plot", str(d / "p.png"), "--html", str(d / "p.html")] if option == "--csv" else []
        return [*argv, option, path], d

    pins = st.lists(
        st.tuples(
            st.sampled_from(["--dp", "--tp", "--pp", "-k", "--zero", "--microbatch-size", "--hsdp"]), NUMBERS
        ),
        max_size=3,
    )
    return {
        "simulate": st.builds(
            lambda m, s, b, c: (
                ["simulate", "--model", m, "--strategy", s, "--batch", b, "--cluster", c],
                None,
            ),
            MODELS,
            STRATEGIES,
            NUMBERS,
            CLUSTERS,
        ),
        "search": st.builds(
            lambda m, c, b, p: (
                [
                    "search",
                    "--model",
                    m,
                    "--cluster",
                    c,
                    "--batch",
                    b,
                    "--top",
                    "1",
                    "--fresh",
                    "--max-microbatches",
                    "4",
                ]
                + [x for pin in p for x in pin],
                None,
            ),
            st.sampled_from([TINY]) | MODELS,
            st.sampled_from(["p3.8xlarge", "dgx-a100", "p3.8xlarge:1+g4dn.12xlarge:1", "", "dgx-a100:²"]),
            st.sampled_from(["8", "16"]) | NUMBERS,
            pins,
        ),
        "toml": st.builds(toml, TOML_TEXTS, st.sampled_from(["clusters", "simulate"])),
        "outputs": st.builds(
            output, st.sampled_from(["--csv", "--html", "--plot", "--store", "--trace"]), PATH_KINDS
        ),
        "programs": st.builds(
            program,
            st.sampled_from(PROGRAMS),
            st.integers(0, 200),
            st.sampled_from(["0", "1", "3", "100000", "99999999999999999999", "²", "-1", "", "(", "1.5"]),
            st.sampled_from(["show", "lower", "exec", "simulate"]),
            NUMBERS,
        ),
        "shard": st.builds(
            lambda mesh, ann, stage: (
                ["shard", str(PROGRAMS[-1]), "--mesh", mesh, "--stage", stage]
                + [x for a in ann for x in ("--annotate", a)],
                None,
            ),
            st.builds("{}={}".format, st.sampled_from(["tp", "dp", "x"]), NUMBERS)
            | st.builds("dp={},tp={}".format, SMALL, SMALL),
            st.lists(
                st.builds(
                    "{}={}".format,
                    st.sampled_from(["w1", "w2", "x", ""]),
                    st.sampled_from(["S(0)", "S(1)", "R", "S(²)", "x"]),
                ),
                max_size=2,
            ),
            st.sampled_from(["propagate", "legalize", "optimize", "materialize", "ranks", "x"]),
        ),
    }


def _run_family(
    strategy: st.SearchStrategy[tuple[list[str], Path | None]],
    examples: int,
    seed: int,
    each: Callable[[list[str], Path | None], None],
) -> None:
    """``each(argv, cwd)`` on ``examples`` command lines hypothesis draws from ``strategy`` (a
    run of one property, never failing: the outcomes are counted, not asserted)."""

    @hypothesis.seed(seed)
    @hypothesis.settings(
        max_examples=examples,
        database=None,
        phases=(hypothesis.Phase.generate,),
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(strategy)
    def one(case: tuple[list[str], Path | None]) -> None:
        each(*case)

    one()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=200, help="command lines per family")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per command line")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="", help="comma-separated subset (default: all)")
    args = ap.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    bad: list[Outcome] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="distir-fuzz-") as d:
        families = _families(Path(d))
        chosen = [f for f in args.families.split(",") if f] or list(families)
        for name in chosen:

            def each(argv: list[str], cwd: Path | None, name: str = name) -> None:
                got = run_cli(argv, timeout_s=args.timeout, cwd=cwd)
                counts["tried"] += 1
                if got.timed_out:
                    counts["time-outs"] += 1
                elif got.traceback:
                    counts["tracebacks"] += 1
                elif got.clean:
                    counts["worked" if got.code == 0 else "clean errors"] += 1
                else:
                    counts["not one line"] += 1
                if not got.clean:
                    bad.append(got)
                    print(f"[{name}] {got.describe()}\n", flush=True)

            _run_family(families[name], args.examples, args.seed + len(name), each)
            print(f"{name}: done ({counts['tried']} tried so far, {time.monotonic() - t0:.0f} s)", flush=True)
    print(
        f"inputs tried {counts['tried']}, worked {counts['worked']}, clean errors {counts['clean errors']}, "
        f"tracebacks {counts['tracebacks']}, time-outs {counts['time-outs']}, "
        f"errors of more than one line {counts['not one line']} ({time.monotonic() - t0:.0f} s)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
