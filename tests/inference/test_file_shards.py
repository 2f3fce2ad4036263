"""Shards planned from the corpus file without holding it: byte ranges with ids and text hashes, read back by the
worker (checked), or sent with their text; empty documents left out; the same errors as any corpus read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memreader.core.corpus import CorpusError, read_corpus
from memreader.inference.shards import Shard, ShardError, plan_file_shards


def _corpus(path: Path) -> Path:
    lines = [json.dumps({"id": f"d{i}", "text": f"Document {i}. " + "word " * i, "lang": "en"}) for i in range(7)]
    lines.insert(3, json.dumps({"id": "blank", "text": "   "}))
    lines.insert(5, "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_file_shards_read_back_what_the_corpus_holds(tmp_path: Path) -> None:
    path = _corpus(tmp_path / "c.jsonl")
    plan = plan_file_shards(path, 3)
    assert plan.documents == 7 and plan.empty == ["blank"]
    docs = [d for d in read_corpus(path) if d.text.strip()]
    in_memory = [Shard(i, docs[start:start + 3]) for i, start in enumerate(range(0, len(docs), 3))]
    assert [s.digest() for s in plan.shards] == [s.digest() for s in in_memory]  # the same plan either way
    assert all(s.docs is None for s in plan.shards)  # the driver holds ids and hashes only
    for shard in plan.shards:
        worker = Shard.from_payload(shard.index, shard.payload())  # what travels: a byte range and the refs
        assert "Document" not in shard.payload()
        assert [(d.doc_id, d.text, d.meta) for d in worker.load()] == [
            (d.doc_id, d.text, d.meta) for d in docs if d.doc_id in shard.ids]
    sent = Shard.from_payload(1, plan.shards[1].with_text().payload())
    assert sent.span is None and [d.doc_id for d in sent.load()] == plan.shards[1].ids
    assert plan_file_shards(path, 3, limit=4).documents == 3  # limit counts records, the blank one included


def test_a_changed_or_missing_file_is_named(tmp_path: Path) -> None:
    path = _corpus(tmp_path / "c.jsonl")
    shard = plan_file_shards(path, 3).shards[1]
    path.write_text(path.read_text(encoding="utf-8").replace("Document 4.", "Document four."), encoding="utf-8")
    with pytest.raises(ShardError, match=r"shard-00001: .*changed since the run was planned \('d4' is another text\)"):
        Shard.from_payload(1, shard.payload()).load()
    path.unlink()
    with pytest.raises(ShardError, match="send_text=true"):
        Shard.from_payload(1, shard.payload()).load()


def test_bad_corpus_lines_are_named_by_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c.jsonl:2: duplicate id 'a'"):
        plan_file_shards(path, 2)


def test_line_separators_inside_texts_do_not_split_records(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    texts = ["Web text\u2028with a line separator.", "PDF text\u0085next line\u2029para."]
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}, ensure_ascii=False) + "\n"
                            for i, t in enumerate(texts)), encoding="utf-8")
    (shard,) = plan_file_shards(path, 4).shards
    assert [d.text for d in Shard.from_payload(0, shard.payload()).load()] == texts
