"""The resumable result store and ``run_all``: round trips, isolation, errors, and that killing a
search mid-way and rerunning it loses no finished result and repeats none."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from distir.search import executor
from distir.search.executor import EXECUTORS, ExecutorError, new_pool, run_all, stop_pool
from distir.search.store import SCHEMA_VERSION, ResultStore, StoreError, dumps, loads, search_key

from . import _store_tasks
from ._store_tasks import failing, interrupting, logged, pure, tasks

KEY = "0123456789abcdef"
META = {"model": "gpt2", "cluster": "dgx-a100x2", "batch": 8}


def _log_lines(log: Path) -> list[tuple[str, int]]:
    if not log.exists():
        return []
    return [(task, int(pid)) for task, pid in (line.split() for line in log.read_text().splitlines())]


def _evaluations(log: Path) -> Counter[str]:
    return Counter(task for task, _ in _log_lines(log))


# ---------------------------------------------------------------- store


def test_put_done_final_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with ResultStore(db, KEY, META) as store:
        assert store.done() == {}
        assert store.final() is None
        store.put("d2.t4.p2.k8.1f1b", {"time": 1.5, "memory": [1, 2], "fits": True, "note": None})
        store.put("d1.t8.p2.k8.gpipe", {"time": 2.25})
        store.put_final({"best": "d2.t4.p2.k8.1f1b", "table": [["a", 1.0]]})
    # A new connection sees everything: the writes were committed, not just buffered.
    with ResultStore(db, KEY, {"other": "meta"}) as store:
        done = store.done()
        assert list(done) == ["d2.t4.p2.k8.1f1b", "d1.t8.p2.k8.gpipe"]
        assert done["d2.t4.p2.k8.1f1b"] == {"time": 1.5, "memory": [1, 2], "fits": True, "note": None}
        assert done["d1.t8.p2.k8.gpipe"] == {"time": 2.25}
        assert store.final() == {"best": "d2.t4.p2.k8.1f1b", "table": [["a", 1.0]]}
        assert store.meta == META  # kept from the first open
        store.put_final({"best": "x"})
        assert store.final() == {"best": "x"}


def test_nonfinite_floats_round_trip_as_standard_json(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    result = {"inf": math.inf, "ninf": -math.inf, "nan": math.nan, "nested": [math.inf, {"x": -math.inf}]}
    with ResultStore(db, KEY, META) as store:
        store.put("s", result)
        store.put_final({"best_time": math.inf})
    with ResultStore(db, KEY, META) as store:
        back = store.done()["s"]
        assert store.final() == {"best_time": math.inf}
    assert back["inf"] == math.inf and back["ninf"] == -math.inf
    assert isinstance(back["nan"], float) and math.isnan(back["nan"])
    assert back["nested"] == [math.inf, {"x": -math.inf}]

    def no_constants(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name} in the store")

    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT json FROM results").fetchone()
    json.loads(text, parse_constant=no_constants)


def test_dumps_normalises_and_rejects() -> None:
    assert loads(dumps({"t": (1, 2.5), "b": False})) == {"t": [1, 2.5], "b": False}
    with pytest.raises(TypeError, match="not storable"):
        dumps({"x": object()})
    with pytest.raises(TypeError, match="not a str"):
        dumps({1: "a"})
    with pytest.raises(TypeError, match="reserved"):
        dumps({"__distir_float__": "inf"})


def test_two_keys_in_one_file_are_isolated(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with ResultStore(db, "key-a", {"m": "a"}) as a, ResultStore(db, "key-b", {"m": "b"}) as b:
        a.put("s1", {"v": 1})
        b.put("s1", {"v": 2})  # the same strategy under another key is not a duplicate
        b.put("s2", {"v": 3})
        a.put_final({"who": "a"})
        assert a.done() == {"s1": {"v": 1}}
        assert b.done() == {"s1": {"v": 2}, "s2": {"v": 3}}
        assert a.final() == {"who": "a"}
        assert b.final() is None
        assert (a.meta, b.meta) == ({"m": "a"}, {"m": "b"})


def test_duplicate_put_raises_and_keeps_the_first(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        store.put("s", {"v": 1})
        with pytest.raises(StoreError, match="already has a result for strategy 's'"):
            store.put("s", {"v": 2})
        assert store.done() == {"s": {"v": 1}}


def test_unstorable_result_raises_and_stores_nothing(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        with pytest.raises(StoreError, match=r"result of 's' is not storable.*object"):
            store.put("s", {"v": object()})
        assert store.done() == {}


def test_non_sqlite_file_raises_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    content = b'{"this": "is not a database"}\n' * 200
    path.write_bytes(content)
    with pytest.raises(StoreError) as info:
        ResultStore(path, KEY, META)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content  # not touched


def test_other_applications_database_raises(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(StoreError, match="not a distir result store") as info:
        ResultStore(path, KEY, META)
    assert str(path) in str(info.value)


def test_schema_version_mismatch_raises(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    ResultStore(path, KEY, META).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}") as info:
        ResultStore(path, KEY, META)
    assert str(path) in str(info.value)


def test_closed_store_raises(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "s.db", KEY, META)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.done()
    with pytest.raises(StoreError, match="closed"):
        store.put("s", {})


def test_store_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    ResultStore(path, KEY, META).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_search_key_is_sha256_of_canonical_json() -> None:
    expected = hashlib.sha256(b'{"a":1,"b":[1,2.5],"c":{"x":"y"}}').hexdigest()[:16]
    assert search_key({"c": {"x": "y"}, "b": (1, 2.5), "a": 1}) == expected
    assert search_key({"a": 1, "b": [1, 2.5], "c": {"x": "y"}}) == expected
    assert search_key({"a": 2, "b": [1, 2.5], "c": {"x": "y"}}) != expected
    assert len(search_key({"inf": math.inf})) == 16


# ---------------------------------------------------------------- run_all


def test_results_in_task_order(tmp_path: Path) -> None:
    order = ["zz", "a", "mmm", "b"]
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        results = run_all(order, pure, store)
        assert list(results) == order
        assert results == {task: pure(task) for task in order}
        assert store.done() == results


def test_cached_tasks_are_not_reevaluated(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    fn = functools.partial(logged, str(log))
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        first = run_all(tasks(3), fn, store)
    assert _evaluations(log) == Counter(tasks(3))
    calls: list[tuple[int, int]] = []
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        second = run_all(tasks(5), fn, store, progress=lambda done, total: calls.append((done, total)))
    assert _evaluations(log) == Counter(tasks(5))  # t00..t02 still once each
    assert list(second) == tasks(5)
    assert {task: second[task] for task in tasks(3)} == first  # same nonces: the stored results
    assert calls == [(3, 5), (4, 5), (5, 5)]


def test_duplicate_tasks_are_evaluated_once(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        results = run_all(["a", "b", "a"], functools.partial(logged, str(log)), store)
    assert _evaluations(log) == Counter({"a": 1, "b": 1})
    assert set(results) == {"a", "b"}


def test_errors_are_stored_and_not_rerun(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    fn = functools.partial(failing, str(log))
    order = ["ok1", "bad1", "ok2"]
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        results = run_all(order, fn, store)
        assert results["bad1"] == {"error": "ValueError: cannot evaluate bad1"}
        assert results["ok1"]["task"] == "ok1"
        assert store.done()["bad1"] == results["bad1"]
        again = run_all(order, fn, store)
    assert again == results
    assert _evaluations(log) == Counter(order)


def test_unstorable_result_becomes_an_error_result(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        results = run_all(["a"], _returns_object, store)
    assert results["a"]["error"].startswith("TypeError: result is not storable")


def _returns_object(task: str) -> dict[str, Any]:
    return {"task": task, "payload": object()}


@pytest.mark.parametrize("workers", [1, 2])
def test_keyboard_interrupt_stops_the_run(tmp_path: Path, workers: int) -> None:
    log = tmp_path / "eval.log"
    order = ["a", "stop", *tasks(6)]
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        with pytest.raises(KeyboardInterrupt):
            run_all(order, functools.partial(interrupting, str(log)), store, workers=workers)
        done = store.done()
    assert "stop" not in done  # an interrupt is not a result
    if workers == 1:
        assert list(done) == ["a"]
        assert _evaluations(log) == Counter(["a", "stop"])


@pytest.mark.parametrize("start_method", ["default", "spawn"])
def test_two_local_workers_match_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_method: str
) -> None:
    if start_method != "default":  # the platform default is fork on Linux; spawn is what macOS gets
        monkeypatch.setattr(executor, "_mp_context", lambda: multiprocessing.get_context(start_method))
    order = tasks(8)
    with ResultStore(tmp_path / "one.db", KEY, META) as store:
        serial = run_all(order, pure, store)
    calls: list[tuple[int, int]] = []
    with ResultStore(tmp_path / "two.db", KEY, META) as store:
        parallel = run_all(order, pure, store, workers=2, progress=lambda d, t: calls.append((d, t)))
        assert store.done() == serial
    assert list(parallel) == order
    assert parallel == serial
    assert calls == [(i, 8) for i in range(9)]


def test_local_workers_run_in_other_processes(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        results = run_all(tasks(4), functools.partial(logged, str(log), sleep=0.05), store, workers=2)
    pids = {result["pid"] for result in results.values()}
    assert os.getpid() not in pids
    assert _evaluations(log) == Counter(tasks(4))


def test_without_a_store_workers_still_run_in_other_processes(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    order = ["a", "b", "a", "c"]
    results = run_all(order, functools.partial(failing, str(log)), None, workers=2)
    assert list(results) == ["a", "b", "c"]
    assert os.getpid() not in {r["pid"] for r in results.values()}
    assert _evaluations(log) == Counter(["a", "b", "c"])  # a repeated task is evaluated once
    bad = run_all(["bad1"], functools.partial(failing, str(log)), None)
    assert bad == {"bad1": {"error": "ValueError: cannot evaluate bad1"}}


def test_unpicklable_fn_raises_and_stores_nothing(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        with pytest.raises(ExecutorError, match="picklable"):
            run_all(tasks(3), lambda task: {"task": task}, store, workers=2)
        assert store.done() == {}  # not stored as errors: a rerun with a picklable fn retries them


def test_bad_arguments_raise(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        with pytest.raises(ExecutorError) as info:
            run_all(["a"], pure, store, executor="dask")
        assert all(name in str(info.value) for name in EXECUTORS)
        with pytest.raises(ExecutorError, match="workers"):
            run_all(["a"], pure, store, workers=0)
        assert store.done() == {}


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="Ray is installed")
def test_ray_missing_raises(tmp_path: Path) -> None:
    with (
        ResultStore(tmp_path / "s.db", KEY, META) as store,
        pytest.raises(ExecutorError, match=r"pip install 'distir\[ray\]'"),
    ):
        run_all(["a"], pure, store, executor="ray")


class _Ref:
    def __init__(self, value: Any) -> None:
        self.value = value


class _Remote:
    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self.fn = fn
        self.options = options

    def remote(self, *args: Any) -> _Ref:
        values = [arg.value if isinstance(arg, _Ref) else arg for arg in args]
        try:
            return _Ref(self.fn(*values))
        except Exception as exc:
            return _Ref(exc)


class _FakeRayError(Exception):
    """Stands for ``ray.exceptions.RayError``, the base of the errors Ray raises."""


class _FakeRay(types.ModuleType):
    """The part of Ray's API ``run_all`` uses, evaluating eagerly and completing the newest task
    first, so results arrive out of submission order."""

    def __init__(self) -> None:
        super().__init__("ray")
        self.inits: list[dict[str, Any]] = []
        self.remotes: list[_Remote] = []
        self.most_in_flight = 0
        self.cancelled = 0
        self.exceptions = types.SimpleNamespace(RayError=_FakeRayError)

    def init(self, address: str | None = None, **kwargs: Any) -> None:
        self.inits.append({"address": address, **kwargs})

    def put(self, value: Any) -> _Ref:
        return _Ref(value)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        def wrap(fn: Callable[..., Any]) -> _Remote:
            self.remotes.append(_Remote(fn, kwargs))
            return self.remotes[-1]

        return wrap(args[0]) if args else wrap

    def wait(self, refs: list[_Ref], *, num_returns: int = 1) -> tuple[list[_Ref], list[_Ref]]:
        self.most_in_flight = max(self.most_in_flight, len(refs))
        split = len(refs) - num_returns
        return refs[split:], refs[:split]

    def get(self, ref: _Ref) -> Any:
        if isinstance(ref.value, Exception):
            raise ref.value
        return ref.value

    def cancel(self, ref: _Ref, *, force: bool = False) -> None:
        self.cancelled += 1


def test_ray_executor_with_fake_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    order = tasks(5)
    calls: list[tuple[int, int]] = []
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        store.put("t01", pure("t01"))
        results = run_all(
            order, pure, store, workers=2, executor="ray", progress=lambda d, t: calls.append((d, t))
        )
        assert store.done() == results
    assert list(results) == order
    assert results == {task: pure(task) for task in order}
    assert fake.inits == [{"address": "ray://head:10001", "ignore_reinit_error": True}]
    assert [remote.options for remote in fake.remotes] == [{"num_cpus": 1}]
    assert fake.most_in_flight == 2
    assert calls == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]


def test_ray_failure_raises_keeps_stored_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def get(ref: _Ref) -> Any:
        if ref.value.get("task") == "t02":
            raise _FakeRayError("worker node lost")
        return ref.value

    monkeypatch.setattr(fake, "get", get)
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        with pytest.raises(ExecutorError, match="worker node lost"):
            run_all(tasks(4), pure, store, workers=1, executor="ray")
        assert store.done() == {"t00": pure("t00"), "t01": pure("t01")}
    assert fake.inits == [{"address": None, "ignore_reinit_error": True}]


def test_a_bug_around_ray_is_not_called_a_ray_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only Ray's own errors become ``ExecutorError``; anything else raised around the evaluation
    (a bug) propagates as it is, and the tasks in flight are cancelled."""
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)

    def get(ref: _Ref) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(fake, "get", get)
    with ResultStore(tmp_path / "s.db", KEY, META) as store:
        with pytest.raises(KeyError, match="a bug"):
            run_all(tasks(4), pure, store, workers=2, executor="ray")
        assert store.done() == {}
    assert fake.cancelled == 1  # the other task in flight


def test_unshippable_fn_on_ray_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)

    def put(value: Any) -> _Ref:
        raise TypeError("cannot pickle '_thread.lock' object")

    monkeypatch.setattr(fake, "put", put)
    with pytest.raises(ExecutorError, match="cannot ship"):
        run_all(tasks(2), pure, None, executor="ray")


def test_stopping_a_pool_twice_is_harmless() -> None:
    """``stop_pool`` on a pool whose processes it already ended and the pool closed."""
    pool = new_pool(2)
    assert pool.submit(pure, "a").result() == pure("a")
    stop_pool(pool)
    stop_pool(pool)


# ---------------------------------------------------------------- kill and resume


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.parametrize("workers", [1, 2])
def test_kill_and_resume_loses_nothing_and_repeats_nothing(tmp_path: Path, workers: int) -> None:
    db, log = tmp_path / "s.db", tmp_path / "eval.log"
    count, sleep = 12, 0.15
    ResultStore(db, KEY, META).close()  # created up front, so polling never races its creation
    module = _store_tasks.__name__
    import_root = Path(_store_tasks.__file__).resolve().parents[module.count(".")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(import_root), os.environ.get("PYTHONPATH")])),
    }
    linux = sys.platform.startswith("linux")
    stderr = (tmp_path / "stderr.txt").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from {module} import main; main(sys.argv[1:])",
            *(str(arg) for arg in (db, KEY, log, workers, count, sleep)),
        ],
        cwd=tmp_path,
        env=env,
        stderr=stderr,
        # Elsewhere than Linux pool workers do not die with their parent, so kill the whole group.
        start_new_session=not linux,
    )
    try:
        deadline = time.monotonic() + 30.0
        with ResultStore(db, KEY, META) as store:
            while len(store.done()) < 3:
                assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
                assert time.monotonic() < deadline, "the search stored nothing in 30 s"
                time.sleep(0.01)
        # Only the search's own process, as `kill -9 PID` would: its workers must not outlive it.
        if linux:
            proc.send_signal(signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr.close()
    assert proc.returncode == -signal.SIGKILL

    # No evaluation outlives the kill: every process that evaluated is gone, and the log stays still.
    pids = {pid for _, pid in _log_lines(log)}
    try:
        deadline = time.monotonic() + 5.0
        while linux and any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not (linux and any(_alive(pid) for pid in pids)), "a worker outlived the killed search"
        size = log.stat().st_size
        time.sleep(2 * sleep)
        assert log.stat().st_size == size, "an orphaned worker kept evaluating after the kill"
    finally:
        for pid in pids:  # on failure, do not leave this test's orphans behind
            if linux and _alive(pid):
                os.kill(pid, signal.SIGKILL)

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with ResultStore(db, KEY, META) as store:
        before = store.done()
    assert 3 <= len(before) < count, "the kill should land mid-search"
    assert all(result["task"] == task for task, result in before.items())
    logged_before = _evaluations(log)
    assert all(logged_before[task] == 1 for task in before)

    calls: list[tuple[int, int]] = []
    with ResultStore(db, KEY, META) as store:
        fn = functools.partial(logged, str(log), sleep=0.02)
        results = run_all(
            tasks(count), fn, store, workers=workers, progress=lambda d, t: calls.append((d, t))
        )
        after = store.done()
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT strategy, count(*) FROM results WHERE key = ? GROUP BY strategy", (KEY,))
    assert dict(rows.fetchall()) == dict.fromkeys(tasks(count), 1)
    conn.close()

    assert list(results) == tasks(count)
    assert after == results
    for task, result in before.items():
        assert results[task] == result  # same pid and nonce: stored, not evaluated again
    evaluations = _evaluations(log)
    assert set(evaluations) == set(tasks(count))
    assert all(evaluations[task] == 1 for task in before)
    # Only an evaluation in flight at the kill (finished but not yet stored) may run again.
    repeated = [task for task, n in evaluations.items() if n > 1]
    assert all(evaluations[task] == 2 for task in repeated)
    assert len(repeated) <= workers
    assert calls[0] == (len(before), count)
    assert calls[-1] == (count, count)
