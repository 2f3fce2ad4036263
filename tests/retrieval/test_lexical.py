"""Milvus' built-in BM25 through :mod:`memreader.retrieval.lexical`, on real Milvus Lite."""

from __future__ import annotations

from pathlib import Path

from pymilvus import DataType, MilvusClient

from memreader.retrieval.lexical import add_bm25, bm25_search, detect_language, text_field_params


def _store(path: Path, language: str, texts: list[str]) -> MilvusClient:
    client = MilvusClient(str(path))
    schema = MilvusClient.create_schema(auto_id=False)
    schema.add_field("pk", DataType.INT64, is_primary=True)
    schema.add_field("text", DataType.VARCHAR, max_length=1000, **text_field_params(language))
    params = client.prepare_index_params()
    add_bm25(schema, params)
    client.create_collection("t", schema=schema, index_params=params)
    client.insert("t", [{"pk": i, "text": t} for i, t in enumerate(texts)])
    return client


def test_chinese_punctuation_is_not_a_search_term(tmp_path: Path) -> None:
    """A question's "？" must not match rows that share only the question mark."""
    client = _store(tmp_path / "zh.db", "zh", ["厦门大学是一所大学？", "北京天气很好？", "上海有很多公园。"])
    try:
        assert bm25_search(client, "t", "？", 3) == []
        hits = bm25_search(client, "t", "厦门在哪里？", 3, output_fields=["pk"])
        assert [e["pk"] for e, _ in hits] == [0] and hits[0][1] > 0
    finally:
        client.close()


def test_english_scores_are_positive_and_ranked(tmp_path: Path) -> None:
    client = _store(tmp_path / "en.db", "en", ["the cat sat on the mat", "cat cat cat everywhere", "dogs running"])
    try:
        hits = bm25_search(client, "t", "cat", 3, output_fields=["pk"])
        assert [e["pk"] for e, _ in hits] == [1, 0]
        assert hits[0][1] > hits[1][1] > 0
    finally:
        client.close()


def test_language_detection() -> None:
    assert detect_language(["厦门大学是一所大学"]) == "zh"
    assert detect_language(["The cat sat on the mat."]) == "en"
