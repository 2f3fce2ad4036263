"""BM25 full-text search inside Milvus: analyzers per language, the schema pieces, the search call.

Milvus computes BM25 itself over the collection's own statistics (an analyzed ``text`` field feeds a ``BM25``
function writing a sparse field), so a row's dense and BM25 scores describe the same text. One field has one
analyzer (``jieba`` for Chinese, ``standard`` with lower-casing otherwise; ``auto`` from the share of CJK
characters), so a collection is built for one language. A server returns the BM25 score as the distance, Milvus
Lite its negative: :func:`bm25_search` returns it positive either way. Details: docs/RETRIEVAL.md (The index).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from memreader.core.errors import MemReaderError
from memreader.core.language import LANGUAGES, detect_language

SPARSE_FIELD = "sparse"
PUNCTUATION = "，。？！、；：“”‘’（）《》〈〉【】「」『』…—·～,.?!;:\"'()[]{}<>-–/\\|*&^%$#@~`+=_"
"""Characters the Chinese analyzer drops (the standard tokenizer drops punctuation itself)."""


class LexicalSearchError(MemReaderError, ValueError):
    """A BM25 setting or query cannot be used."""


def resolve_language(language: str, texts: Iterable[str]) -> str:
    """``language`` checked, with ``auto`` decided from ``texts``."""
    if language == "auto":
        return detect_language(texts)
    if language not in LANGUAGES:
        raise LexicalSearchError(f"bm25 language {language!r} is not one of auto, {', '.join(LANGUAGES)}")
    return language


def text_field_params(language: str) -> dict[str, Any]:
    """Keyword arguments for ``schema.add_field`` of the text field that BM25 reads: the analyzer of a language
    of :data:`LANGUAGES`."""
    if language == "zh":
        # jieba keeps punctuation as tokens: without the stop filter a question ending in "？" would
        # match every row holding a "？".
        analyzer = {"tokenizer": "jieba", "filter": ["lowercase", {"type": "stop", "stop_words": list(PUNCTUATION)}]}
    elif language == "en":
        analyzer = {"tokenizer": "standard", "filter": ["lowercase"]}
    else:
        raise LexicalSearchError(f"bm25 language {language!r} is not one of {', '.join(LANGUAGES)}")
    return {"enable_analyzer": True, "analyzer_params": analyzer}


def add_bm25(schema: Any, index_params: Any) -> None:
    """Add the sparse field, the BM25 function that fills it from the field ``text`` (already in ``schema``, added
    with :func:`text_field_params`), and its index."""
    from pymilvus import DataType, Function, FunctionType

    schema.add_field(SPARSE_FIELD, DataType.SPARSE_FLOAT_VECTOR)
    schema.add_function(Function(name="bm25_text", function_type=FunctionType.BM25, input_field_names=["text"],
                                 output_field_names=[SPARSE_FIELD]))
    index_params.add_index(field_name=SPARSE_FIELD, index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")


def bm25_search(client: Any, collection: str, query: str, limit: int, filter: str = "",  # noqa: A002
                output_fields: Sequence[str] = ()) -> list[tuple[dict[str, Any], float]]:
    """The ``limit`` best rows for ``query`` by BM25: ``(entity, score)`` best first, scores > 0. A query with no
    indexable term (only punctuation or stop characters) matches nothing and gives an empty list."""
    if not query.strip():
        raise LexicalSearchError("the BM25 query is empty; ask a question")
    if limit < 1:
        raise LexicalSearchError(f"the BM25 limit must be >= 1, got {limit}")
    (results,) = client.search(collection, data=[query], anns_field=SPARSE_FIELD, limit=limit, filter=filter,
                               output_fields=list(output_fields), search_params={"metric_type": "BM25"})
    return [(dict(r["entity"]), abs(float(r["distance"]))) for r in results]
