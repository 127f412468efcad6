"""The CLI fuzz suite (issue 22): strategy, model and cluster strings, small TOML cluster files,
pins, output paths and mutated programs over ``simulate``, ``search`` (tiny budgets), ``shard``,
``show``, ``lower``, ``exec`` and ``import``. Every command line either works (exit 0) or exits
2 with ONE line on stderr: no traceback, not past the time bound (``cli_fuzz.run_cli`` runs each
in a forked child under a time and memory bound).

The example count per test is ``DISTIR_FUZZ_EXAMPLES`` (default 12: a bounded run in CI);
``bench/bench_fuzz.py`` runs the same generators for longer and prints the counts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
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
    concrete_path,
    mutated_program,
    run_cli,
)

EXAMPLES = int(os.environ.get("DISTIR_FUZZ_EXAMPLES", "12"))
TIMEOUT_S = float(os.environ.get("DISTIR_FUZZ_TIMEOUT_S", "60"))
settings.register_profile(
    "distir-cli-fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: each example runs a command
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FUZZ = settings.get_profile("distir-cli-fuzz")


def check(argv: list[str], cwd: Path | None = None) -> None:
    got = run_cli(argv, timeout_s=TIMEOUT_S, cwd=cwd)
    assert got.clean, got.describe()


@FUZZ
@given(
    model=MODELS, strategy=STRATEGIES, batch=NUMBERS, cluster=CLUSTERS, dtype=st.sampled_from(["f32", "bf16"])
)
def test_simulate_model_strategy_cluster(
    model: str, strategy: str, batch: str, cluster: str, dtype: str
) -> None:
    check(
        [
            "simulate",
            "--model",
            model,
            "--strategy",
            strategy,
            "--batch",
            batch,
            "--cluster",
            cluster,
            "--dtype",
            dtype,
        ]
    )


PINS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "--dp",
                "--tp",
                "--pp",
                "-k",
                "--zero",
                "--microbatch-size",
                "--hsdp",
                "--max-microbatches",
                "--top",
            ]
        ),
        NUMBERS,
    )
    | st.tuples(st.just("--schedule"), st.sampled_from(["1f1b", "gpipe", "interleaved", "zb1", "x", ""]))
    | st.tuples(st.just("--recompute"), st.sampled_from(["none", "selective", "full", "ops", "x", ""])),
    max_size=3,
)


@pytest.mark.slow
@FUZZ
@given(
    model=st.sampled_from([TINY, "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=64"]) | MODELS,
    # small clusters only: a search of hundreds of GPUs is valid work, not a tiny budget
    cluster=st.sampled_from(
        ["p3.8xlarge", "dgx-a100", "p3.8xlarge:1+g4dn.12xlarge:1", "", "x", "dgx-a100:²"]
    ),
    batch=st.sampled_from(["8", "16"]) | NUMBERS,
    pins=PINS,
)
def test_search_tiny_budgets(model: str, cluster: str, batch: str, pins: list[tuple[str, str]]) -> None:
    argv = ["search", "--model", model, "--cluster", cluster, "--batch", batch, "--top", "1", "--fresh"]
    argv += ["--max-microbatches", "4", "--workers", "1"]
    check(argv + [x for pin in pins for x in pin] + ["--json"])


@FUZZ
@given(text=TOML_TEXTS, command=st.sampled_from(["simulate", "clusters", "search"]))
def test_cluster_toml_files(tmp_path_factory: pytest.TempPathFactory, text: str, command: str) -> None:
    path = tmp_path_factory.mktemp("toml") / "c.toml"
    path.write_text(text, encoding="utf-8")
    if command == "simulate":
        check(
            ["simulate", "--model", TINY, "--strategy", "d2.t1.p1.k1", "--batch", "8", "--cluster", str(path)]
        )
    elif command == "clusters":
        check(["clusters", "--cluster", str(path)])
    else:
        check(["search", "--model", TINY, "--cluster", str(path), "--batch", "8", "--top", "1", "--fresh"])


@pytest.mark.slow
@FUZZ
@given(
    option=st.sampled_from(["--csv", "--html", "--plot", "--store", "--export-out", "--trace", "--out"]),
    kind=PATH_KINDS,
)
def test_output_paths(tmp_path_factory: pytest.TempPathFactory, option: str, kind: str) -> None:
    scratch = tmp_path_factory.mktemp("out")
    path = concrete_path(kind, scratch, ".out")
    if option == "--trace":
        check(["simulate", "--model", TINY, "--strategy", "d2.t1.p1.k1", "--batch", "8", "--trace", path])
    elif option == "--out":
        argv = ["export", "--to", "torchtitan", "--model", TINY, "--strategy", "d2.t1.p1.k1", "--batch", "8"]
        check([*argv, "--out", path])
    else:
        argv = ["search", "--model", TINY, "--cluster", "p3.8xlarge", "--batch", "8", "--top", "1"]
        argv += ["--store", str(scratch / "s.sqlite")] if option != "--store" else []
        argv += ["--plot", str(scratch / "p.png")] if option != "--plot" else []
        argv += ["--html", str(scratch / "p.html")] if option != "--html" else []
        argv += ["--export", "torchtitan"] if option == "--export-out" else []
        check([*argv, option, path], cwd=scratch)


@FUZZ
@given(
    program=st.sampled_from(PROGRAMS),
    spot=st.integers(0, 200),
    value=st.sampled_from(["0", "1", "3", "100000", "99999999999999999999", "²", "-1", "", "(", "1.5"]),
    command=st.sampled_from(["show", "lower", "exec", "simulate"]),
    number=NUMBERS,
)
def test_program_files(
    tmp_path_factory: pytest.TempPathFactory, program: Path, spot: int, value: str, command: str, number: str
) -> None:
    path = tmp_path_factory.mktemp("prog") / program.name
    path.write_text(mutated_program(program.read_text(), spot, value), encoding="utf-8")
    extra = {"lower": ["--rank", number], "exec": ["--seed", number], "show": [], "simulate": []}[command]
    check([command, str(path), *extra])


@FUZZ
@given(
    mesh=st.builds("{}={}".format, st.sampled_from(["tp", "dp", "x", ""]), NUMBERS)
    | st.builds("dp={},tp={}".format, SMALL, SMALL),
    annotate=st.lists(
        st.builds(
            "{}={}".format,
            st.sampled_from(["w1", "w2", "x", "nosuch", ""]),
            st.sampled_from(["S(0)", "S(1)", "R", "S(²)", "S(-1)", "S(9)", "P", "x", "S(0),R"]),
        ),
        max_size=2,
    ),
    stage=st.sampled_from(["propagate", "legalize", "optimize", "materialize", "ranks", "x"]),
)
def test_shard(mesh: str, annotate: list[str], stage: str) -> None:
    argv = ["shard", str(PROGRAMS[-1]), "--mesh", mesh, "--stage", stage]
    check(argv + [x for a in annotate for x in ("--annotate", a)])


@FUZZ
@given(
    source=st.sampled_from(["hf:", "hf:/no/such", "x.onnx", "garbage.onnx", "config.json", "nosuch", TINY]),
    content=st.sampled_from(["", "{", "{}", '{"model_type": 3}', "\x00\x01garbage", "[1, 2]"]),
    batch=NUMBERS,
)
def test_import_cheap_sources(
    tmp_path_factory: pytest.TempPathFactory, source: str, content: str, batch: str
) -> None:
    scratch = tmp_path_factory.mktemp("import")
    for name in ("garbage.onnx", "config.json"):
        (scratch / name).write_text(content, encoding="utf-8")
    check(["import", source, "--batch", batch], cwd=scratch)
