"""``memreader ask --html``: MeVe's audit and the layers' hits as an offline page, over a real Milvus Lite index,
checked in a real browser (tests/browser.py): every dropped passage is listed with its reason, the fallback's
additions are marked, each hit is highlighted inside its document, no console errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from memreader.cli import main
from memreader.retrieval.audit_page import write_audit_page
from memreader.retrieval.index import MemoryIndexError
from memreader.retrieval.meve import MemoryChunkSource, MeVePipeline, MeVeSettings
from tests.browser import console_errors, open_page
from tests.retrieval.retrieval_samples import VOLCANO

pytestmark = pytest.mark.integration


class OnTopic:
    """A verifier that believes only the chunks that name ash (the rest fall below tau)."""

    name = "on-topic"

    def score(self, question: str, passages: Sequence[str]) -> list[float]:
        return [0.9 if " ash" in p else 0.1 for p in passages]


def test_meve_page_lists_every_candidate_and_why(built: tuple[Any, Any], embedder: Any, tokenizer: Any,
                                                 tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    index, _ = built
    question = "What makes a volcano explode into ash?"
    settings = MeVeSettings(k=6, tau=0.5, n_min=3, fallback_k=3, redundancy=0.5, t_max=80)
    result = MeVePipeline(MemoryChunkSource(index), embedder, OnTopic(), tokenizer, settings).run(question)
    audit = result.audit
    dropped = audit["verify"]["dropped"] + audit["prioritize"]["dropped"] + audit["pack"]["dropped"]
    assert audit["verify"]["dropped"] and audit["fallback"]["fired"] and audit["pack"]["dropped"]  # every fate shows
    page = write_audit_page(index, question, result, tmp_path / "meve.html")
    open_page(browser, page)
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.dropped")
    shown = {(r.get_attribute("data-id"), r.find_element(By.CSS_SELECTOR, "td.reason").text) for r in rows}
    assert {(c["id"], c["reason"]) for c in dropped} <= shown and all(reason for _, reason in shown)
    added = browser.find_elements(By.CSS_SELECTOR, "tr.added")
    assert [r.get_attribute("data-id") for r in added] == [c["id"] for c in audit["fallback"]["added"]]
    assert f"context {audit['tokens']} tokens" in browser.find_element(By.CSS_SELECTOR, ".budget").text
    # every kNN candidate shows the verifier's score (0.9 kept, 0.1 dropped), not the placeholder phase 1 recorded
    kept = {c["id"] for c in audit["verify"]["kept"]}
    assert kept and _cells(browser, 0, _VERIFIER) == {c["id"]: "0.9000" if c["id"] in kept else "0.1000"
                                                      for c in audit["knn"]["candidates"]}
    assert [_cells(browser, 2, _VERIFIER)[c["id"]] for c in audit["fallback"]["added"]] == [
        "not scored" if "verifier_score" not in c else f"{c['verifier_score']:.4f}" for c in audit["fallback"]["added"]]
    marks = browser.find_elements(By.CSS_SELECTOR, ".doc mark.hit")
    assert sorted(" ".join(m.text.split()) for m in marks) == sorted(" ".join(p.text.split()) for p in result.passages)
    volcano = next((d for d in browser.find_elements(By.CSS_SELECTOR, ".doc") if "en-volcano" in d.text), None)
    if volcano is not None:  # the document around a hit is the stored document, whole
        assert volcano.find_element(By.CSS_SELECTOR, ".text").text.split() == VOLCANO.document.split()
    assert console_errors(browser) == []
    with pytest.raises(MemoryIndexError, match="more than 2 rows"):  # a capped query says so, never shortens
        index.rows_where("doc_id", ["en-volcano"], ["pk"], limit=2)


_VERIFIER, _PRIORITY = 4, 5
"""The columns of the verifier's score and the priority score in a phase's table."""


def _cells(browser: Any, phase: int, column: int) -> dict[str, str]:
    """``{passage id: text of the column}`` of the rows of phase table ``phase`` (0 = kNN)."""
    from selenium.webdriver.common.by import By

    section = browser.find_elements(By.CSS_SELECTOR, "section.phase")[phase]
    return {r.get_attribute("data-id"): r.find_elements(By.TAG_NAME, "td")[column].text
            for r in section.find_elements(By.CSS_SELECTOR, "tbody tr")}


def test_meve_page_without_verification_says_not_scored(built: tuple[Any, Any], embedder: Any, tokenizer: Any,
                                                         tmp_path: Path, browser: Any) -> None:
    index, _ = built
    question = "What makes a volcano explode into ash?"
    settings = MeVeSettings(k=4, verify=False, fallback=False, t_max=400)
    result = MeVePipeline(MemoryChunkSource(index), embedder, None, tokenizer, settings).run(question)
    open_page(browser, write_audit_page(index, question, result, tmp_path / "unverified.html"))
    found = result.audit["knn"]["candidates"]
    assert len(found) == 4 and set(_cells(browser, 0, _VERIFIER).values()) == {"not scored"}
    assert _cells(browser, 0, _PRIORITY) == {c["id"]: f"{c['similarity']:.4f}" for c in found}  # the cosine
    assert console_errors(browser) == []


def test_ask_html_shows_which_layer_found_each_hit(built: tuple[Any, Any], tmp_path: Path, browser: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from selenium.webdriver.common.by import By

    index, _ = built
    out = tmp_path / "layers.html"
    index.close()  # Milvus Lite serves a file to one client at a time: the command opens it itself
    saved = tmp_path / "hits.json"
    assert main(["ask", "--set", f"db_path={index.uri}", "--set", "device=cpu", "--set", "top_k=3", "--html", str(out),
                 "--save", str(saved), "How do observatories forecast an eruption?"]) == 0
    printed = capsys.readouterr()
    assert f"audit page -> {out}" in printed.err and f"result -> {saved}" in printed.err
    hits = json.loads(saved.read_text(encoding="utf-8"))  # --save writes JSON whatever stdout shows (text here)
    assert hits["question"] == "How do observatories forecast an eruption?" and len(hits["hits"]) == 3
    assert not printed.out.lstrip().startswith("{") and hits["hits"][0]["text"][:60] in printed.out
    open_page(browser, out)
    rows = browser.find_elements(By.CSS_SELECTOR, "tbody tr[data-rank]")
    assert len(rows) == 3
    for row in rows:
        layers = [p.text.split()[0] for p in row.find_elements(By.CSS_SELECTOR, "td.layers .pill")]
        assert layers and set(layers) <= {"outline", "core", "chunk"}
    assert "Monitoring volcanoes" in rows[0].text
    assert len(browser.find_elements(By.CSS_SELECTOR, ".doc mark.hit")) == 3
    assert console_errors(browser) == []
