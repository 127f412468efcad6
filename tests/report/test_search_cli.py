"""``distir search``'s files (issue 22): every output path is checked before the search starts
(one line, exit 2, nothing searched), the outputs are written atomically, a read-only or
hand-edited store is a one-line error naming the problem."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import distir.search.run as run_mod
from distir.cli import main
from distir.search import store as store_mod
from distir.search.run import SearchRequest
from distir.search.store import ResultStore, StoreError, search_key

MODEL = "mlp:layers=2,hidden=64"
BASE = ["search", "--model", MODEL, "--cluster", "p3.8xlarge", "--batch", "8", "--top", "1", "--workers", "1"]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    got = capsys.readouterr()
    return int(done.value.code or 0), got.out, got.err


def _no_search(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the search ran before its output paths were checked")

    monkeypatch.setattr(run_mod, "search", refuse)


@pytest.mark.parametrize("option", ["--csv", "--plot", "--html", "--store", "--export-out"])
@pytest.mark.parametrize("kind", ["directory", "under-a-file"])
def test_a_bad_output_path_fails_before_the_search(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    option: str,
    kind: str,
) -> None:
    _no_search(monkeypatch)
    (tmp_path / "a-file").write_text("x")
    path = tmp_path if kind == "directory" else tmp_path / "a-file" / "out"
    extra = ["--export", "torchtitan"] if option == "--export-out" else []
    code, _, err = cli([*BASE, *extra, option, str(path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert option in err and ("is a directory" in err or "is not a directory" in err)


def test_an_unwritable_cache_directory_fails_before_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_search(monkeypatch)
    cache = tmp_path / "cache"
    cache.mkdir()
    real = __import__("os").access
    monkeypatch.setattr("os.access", lambda p, mode: real(p, mode) and Path(p) != cache)
    code, _, err = cli(BASE, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "not writable" in err and ("--fresh" in err or "--plot" in err)


def test_outputs_are_written_without_a_fixed_temporary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    csv = tmp_path / "r.csv"
    (tmp_path / "r.csv.tmp").symlink_to(victim)  # the old writer followed this link
    argv = [*BASE, "--store", str(tmp_path / "s.sqlite"), "--csv", str(csv)]
    argv += ["--plot", str(tmp_path / "p.png"), "--html", str(tmp_path / "p.html")]
    code, _, err = cli(argv, capsys)
    assert code == 0, err
    assert victim.read_text() == "precious" and csv.read_text().startswith("rank,")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def _stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    store = tmp_path / "s.sqlite"
    code, _, err = cli([*BASE, "--store", str(store)], capsys)
    assert code == 0, err
    con = sqlite3.connect(store)
    key = con.execute("SELECT key FROM searches").fetchone()[0]
    con.close()
    return store, key


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE results SET json = '[1, 2]'",
        'UPDATE results SET json = \'{"fits": "yes"}\'',
        'UPDATE results SET json = \'{"__distir_float__": "huge"}\'',
        "UPDATE results SET json = 'not json'",
        "UPDATE searches SET final = NULL",  # then the results are read (and checked) again
    ],
)
def test_a_hand_edited_store_is_one_line_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str
) -> None:
    store, _ = _stored(tmp_path, capsys)
    con = sqlite3.connect(store)
    con.execute(edit)
    if "results" in edit:
        con.execute("UPDATE searches SET final = NULL")
    else:
        con.execute("UPDATE results SET json = '{\"fits\": true}'")
    con.commit()
    con.close()
    code, _, err = cli([*BASE, "--store", str(store)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(store) in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit",
    [
        "json_set(final, '$.results[0].fits', 'yes')",
        "json_remove(final, '$.results[0].throughput')",
        "json_set(final, '$.timings.screen_s', 'soon')",
        "json_set(final, '$.screened.step_time_s[0]', 'x')",
        "json_set(final, '$.results', json('{}'))",
        "json_set(final, '$.advice', json('[1]'))",
    ],
)
def test_a_hand_edited_finished_output_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: str
) -> None:
    store, _ = _stored(tmp_path, capsys)
    con = sqlite3.connect(store)
    con.execute(f"UPDATE searches SET final = {edit}")
    con.commit()
    con.close()
    code, _, err = cli([*BASE, "--store", str(store)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "edited or damaged" in err


def test_a_read_only_store_says_so_not_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store, _ = _stored(tmp_path, capsys)
    connect = sqlite3.connect  # a read-only file as SQLite sees it (root may write any file)
    monkeypatch.setattr(
        store_mod.sqlite3, "connect", lambda p, **kw: connect(f"file:{p}?mode=ro", uri=True, **kw)
    )
    req = SearchRequest(model=MODEL, cluster="p3.8xlarge", batch=8, top=1, store=store)
    with pytest.raises(StoreError) as got:
        ResultStore(store, search_key(req.key_parts()), req.key_parts())
    assert "cannot be written" in str(got.value) and "corrupt" not in str(got.value)
    code, _, err = cli([*BASE, "--store", str(store)], capsys)
    assert code == 2 and "read-only" in err and "corrupt" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("model", "target", "words"),
    [
        (MODEL, "megatron", "is a model of the mlp family it has no arguments for"),
        ("tests.frontends.torch_models:mlp", "torchtitan", "is an imported model it has no arguments for"),
        ("hf:tests/frontends/configs/qwen2-tiny.json", "megatron", "is a qwen2 config"),
    ],
)
def test_an_export_the_trainer_cannot_take_fails_before_the_search(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], model: str, target: str, words: str
) -> None:
    """Megatron-LM and torchtitan build their own transformers: a model they have no arguments
    for is refused before the search, which would otherwise run in full for nothing."""
    _no_search(monkeypatch)
    argv = [*BASE, "--export", target]
    argv[argv.index(MODEL)] = model
    code, _, err = cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err


def test_export_out_without_export_fails_before_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--export-out`` names where the ``--export`` configuration goes: without ``--export`` it
    would be ignored (nothing written), so it is refused before the search."""
    _no_search(monkeypatch)
    code, _, err = cli([*BASE, "--export-out", str(tmp_path / "cfg.txt")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "give --export TARGET" in err, err
    assert not (tmp_path / "cfg.txt").exists()


def test_a_pinned_k_above_the_bound_given_fails_before_the_search(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-k 4 --max-microbatches 2`` pins k above the bound the user gave on it (the pin won,
    silently): one line before the search. A pinned k above the default bound (128) is taken."""
    _no_search(monkeypatch)
    code, _, err = cli([*BASE, "-k", "4", "--max-microbatches", "2"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "-k 4 is above --max-microbatches 2" in err
    seen: list[int] = []

    def record(req: SearchRequest, *args: object, **kwargs: object) -> None:
        seen.append(req.pins.max_k)
        raise SystemExit(0)

    monkeypatch.setattr(run_mod, "search", record)
    for extra, bound in ((["-k", "2", "--max-microbatches", "2"], 2), (["-k", "256"], 128)):
        cli([*BASE, "--fresh", *extra], capsys)
        assert seen[-1] == bound, extra


def test_a_store_given_with_fresh_fails_before_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--fresh`` neither reads nor writes a store, so a ``--store F`` beside it was ignored
    (nothing written to F): one line before the search; each alone is taken."""
    _no_search(monkeypatch)
    store = tmp_path / "s.sqlite"
    code, _, err = cli([*BASE, "--store", str(store), "--fresh"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"drop --store {store}, or --fresh" in err
    seen: list[Path | None] = []

    def record(req: SearchRequest, *args: object, **kwargs: object) -> None:
        seen.append(req.store)
        raise SystemExit(0)

    monkeypatch.setattr(run_mod, "search", record)
    for extra, want in ((["--store", str(store)], store), (["--fresh"], None)):
        cli([*BASE, *extra], capsys)
        assert seen[-1] == want, extra
