"""Boundary clarity and chunk stickiness (eval/intrinsic/measures.py) on hand-made inputs and real MiniLM embeddings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memreader.core.schema import DocumentMemory, Scenario
from memreader.eval.intrinsic import (
    IntrinsicError,
    boundary_clarity,
    chunk_stickiness,
    null_threshold,
    stickiness_record,
    structural_entropy,
)


def test_structural_entropy_by_hand() -> None:
    # a path a-b-c: degrees 1, 2, 1, 2m = 4: -(1/4 log2 1/4) * 2 - 1/2 log2 1/2 = 1 + 0.5
    assert structural_entropy([1, 2, 1]) == pytest.approx(1.5)
    assert structural_entropy([0, 0, 0]) == 0.0  # no edges: nothing sticks
    # a complete graph of n nodes: every degree n-1, the entropy is log2 n (the most even graph)
    assert structural_entropy([3, 3, 3, 3]) == pytest.approx(2.0)


def test_chunk_graph_edges_follow_the_threshold() -> None:
    v = np.eye(4, dtype=np.float32)
    v[1] = v[0]  # chunks 0 and 1 say the same thing
    cs, edges = chunk_stickiness(v, threshold=0.5)
    assert edges == 1 and cs == pytest.approx(1.0)  # degrees 1, 1, 0, 0
    assert chunk_stickiness(v, threshold=1.0) == (0.0, 0)  # nothing passes a cosine above 1
    assert chunk_stickiness(v[:1], threshold=0.0) == (0.0, 0)  # one chunk: no graph


def test_boundary_clarity_is_the_perplexity_ratio() -> None:
    score = {"single_chunk": False, "boundary_details": {"nll_cond": [1.0, 2.0], "nll_uncond": [1.0, 1.0]}}
    # ppl(q|d)/ppl(q) = exp(nll_cond - nll_uncond): 1 (the previous chunk does not help) and e
    assert boundary_clarity(score) == pytest.approx((1 + math.e) / 2)
    assert boundary_clarity({"single_chunk": True, "boundary_details": {}}) is None
    with pytest.raises(IntrinsicError, match="clarity_variant=ppl"):
        boundary_clarity({"single_chunk": False, "boundary_details": {"p_split": [0.4]}})


def test_threshold_needs_two_documents_and_a_quantile() -> None:
    with pytest.raises(IntrinsicError, match="two documents"):
        null_threshold([np.eye(3)], 0.95)
    with pytest.raises(IntrinsicError, match=r"outside \(0, 1\)"):
        null_threshold([np.eye(3), np.eye(3)], 1.0)


def _memory(doc_id: str, sentences: list[str]) -> DocumentMemory:
    text, spans = "", []
    for s in sentences:
        spans.append((len(text), len(text) + len(s) + 1))
        text += s + " "
    return DocumentMemory(doc_id, text, [Scenario("", "", a, b) for a, b in spans])


@pytest.mark.integration
def test_repeated_chunks_are_stickier_than_distinct_ones() -> None:
    from memreader.core.runtime import load_embedder

    sticky = _memory("sticky", ["The cat sat on the mat.", "A cat was sitting on a mat.", "The cat rested on the mat.",
                                "On the mat sat the cat."])
    distinct = _memory("distinct", ["Stock markets fell sharply on Monday.", "The recipe needs two eggs and flour.",
                                    "Mount Everest is the highest mountain.", "The train leaves at nine."])
    others = [_memory(f"o{i}", [f"Paragraph {i} talks about {t}." for t in ("rivers", "violins", "taxes", "moths")])
              for i in range(3)]
    single = _memory("single", ["One chunk holds the whole document."])
    record = stickiness_record([sticky, distinct, *others, single], load_embedder("minilm-l6"), "minilm-l6",
                               quantile=0.9)
    by_doc = dict(zip(record["doc_ids"], record["per_memory"], strict=True))
    edges = dict(zip(record["doc_ids"], record["edges"], strict=True))
    assert edges["sticky"] == 6 and by_doc["sticky"] == pytest.approx(2.0)  # every pair joined: log2 4
    assert by_doc["distinct"] < by_doc["sticky"]
    assert by_doc["single"] is None  # one chunk: no graph, left out of the mean (as clarity leaves it out)
    assert record["mean"] == pytest.approx(np.mean([v for v in record["per_memory"] if v is not None]))
    assert "K:q0.9-cross-doc" in record["signature"] and -1 <= record["threshold"] <= 1
