"""The result store keys a search by what its results depend on: a cluster file edited between
two searches gives the new answer without ``--fresh`` (never a stale one from the store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distir.search.run import SearchRequest, cluster_digest, search

EXAMPLE = Path(__file__).resolve().parents[2] / "src" / "distir" / "examples" / "clusters" / "amp_hetero.toml"
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
