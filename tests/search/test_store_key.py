"""The result store keys a search by what its results depend on: a cluster file edited between
two searches gives the new answer without ``--fresh`` (never a stale one from the store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import distir
from distir.frontends.torch_import.source import content_digest
from distir.search.rerank import ExactJob, evaluate
from distir.search.run import SearchRequest, cluster_digest, search
from distir.search.store import search_key

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "distir" / "examples" / "clusters" / "amp_hetero.toml"
CONFIGS = Path(__file__).resolve().parents[1] / "frontends" / "configs"
MODEL = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128"


@pytest.mark.slow
def test_an_edited_cluster_file_is_a_new_search(tmp_path: Path) -> None:
    cluster = tmp_path / "c.toml"
    cluster.write_text(EXAMPLE.read_text())
    req = SearchRequest(
        model=MODEL, cluster=str(cluster), batch=16, top=2, workers=1, store=tmp_path / "s.sqlite"
    )
    first = search(req)
    again = search(req)
    assert again.from_store and again.results == first.results  # unchanged file: from the store
    # links inside the V100 nodes 100 times slower to start, T4s with a quarter of their bandwidth
    text = EXAMPLE.read_text().replace("intra_latency_us = 5", "intra_latency_us = 500")
    cluster.write_text(text.replace("memory_bandwidth_gb_s = 320", "memory_bandwidth_gb_s = 80"))
    edited = search(req)
    assert not edited.from_store
    assert [r["step_time_s"] for r in edited.results] != [r["step_time_s"] for r in first.results]


def test_the_digest_follows_the_figures_not_the_name(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(EXAMPLE.read_text())
    b.write_text(EXAMPLE.read_text() + "\n# a comment changes no figure\n")
    assert cluster_digest(str(a)) == cluster_digest(str(b))
    b.write_text(EXAMPLE.read_text().replace("memory_gib = 16", "memory_gib = 24"))
    assert cluster_digest(str(a)) != cluster_digest(str(b))
    assert cluster_digest("dgx-a100") != cluster_digest("dgx-a100:2")


def test_the_key_names_no_path_but_the_contents_and_the_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "sub" / "b.toml"
    b.parent.mkdir()
    a.write_text(EXAMPLE.read_text())
    b.write_text(EXAMPLE.read_text())
    key_a = search_key(SearchRequest(model=MODEL, cluster=str(a)).key_parts())
    assert search_key(SearchRequest(model=MODEL, cluster=str(b)).key_parts()) == key_a
    assert str(a) not in json.dumps(SearchRequest(model=MODEL, cluster=str(a)).key_parts())
    monkeypatch.setattr(distir, "__version__", distir.__version__ + ".post1")
    assert search_key(SearchRequest(model=MODEL, cluster=str(a)).key_parts()) != key_a


def test_an_exact_job_reads_an_edited_cluster_file_again(tmp_path: Path) -> None:
    cluster = tmp_path / "c.toml"
    cluster.write_text(EXAMPLE.read_text())
    job = ExactJob(MODEL, str(cluster), 16)
    first = evaluate(job, "d2.t1.p1.k1")
    cluster.write_text(EXAMPLE.read_text().replace("intra_latency_us = 5", "intra_latency_us = 5000"))
    assert evaluate(job, "d2.t1.p1.k1")["step_time_s"] > first["step_time_s"]


@pytest.mark.slow
def test_an_edited_hugging_face_config_is_a_new_search(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    raw = json.loads(CONFIGS.joinpath("gpt2-tiny.json").read_text())
    config.write_text(json.dumps(raw))
    req = SearchRequest(
        model=f"hf:{config}", cluster="p3.8xlarge:1", batch=4, top=1, store=tmp_path / "s.sqlite"
    )
    first = search(req)
    assert search(req).from_store
    config.write_text(json.dumps(raw | {"n_embd": 64, "n_layer": 4}))
    edited = search(req)
    assert not edited.from_store
    assert edited.screened[0].peak_memory_bytes != first.screened[0].peak_memory_bytes


def test_the_key_follows_a_model_files_contents(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(CONFIGS.joinpath("gpt2-tiny.json").read_text())
    parts = SearchRequest(model=f"hf:{config}").key_parts()
    config.write_text(config.read_text().replace('"n_embd": 16', '"n_embd": 32'))
    assert SearchRequest(model=f"hf:{config}").key_parts()["model_files"] != parts["model_files"]
    factory = tmp_path / "my_tiny_factory.py"
    factory.write_text("def build():\n    return None\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        before = content_digest("my_tiny_factory:build")
        factory.write_text("def build():\n    return 1\n")
        assert content_digest("my_tiny_factory:build") != before != ""
    finally:
        sys.path.remove(str(tmp_path))
    assert content_digest(MODEL) == "" and content_digest("hf:/no/such/config.json").startswith("unreadable")
