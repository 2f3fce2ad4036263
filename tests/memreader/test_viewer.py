"""``memreader view``: the page of a memories file, checked in a real browser (Chromium, tests/browser.py) for what
a user sees — spans that join to the document exactly, the outline scrolling to its chunk, the selected candidate
marked, gaps marked, text with markup shown as written and never run, no console errors — and its bad input."""

from __future__ import annotations

import json
import time
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from memreader.cli import main
from memreader.core.html_page import json_for_script
from memreader.core.schema import DocumentMemory, Scenario, write_memories
from memreader.viewer.documents import ViewerInputError
from memreader.viewer.page import write_view
from tests.browser import console_errors, open_page

HOSTILE = 'Intro </span><script>window.__pwned = 1</script> & <b>bold</b> "quoted"\n\n'


def _memory(doc_id: str, parts: list[str], meta: dict[str, Any] | None = None) -> DocumentMemory:
    text, scenarios = "", []
    for i, part in enumerate(parts):
        scenarios.append(Scenario(f"topic {i} of {doc_id} </li><script>window.__pwned = 2</script>",
                                  f"core {i}: <img src=x onerror='window.__pwned = 3'>", len(text), len(text) + len(part)))
        text += part
    return DocumentMemory(doc_id, text, scenarios, meta=meta or {})


def _long_parts(n: int) -> list[str]:
    return [f"Paragraph {i}. " + "Words that fill the page so the outline has to scroll. " * 12 + "\n\n" for i in range(n)]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("view")
    hostile = _memory("hostile", [HOSTILE, "Second part.\n", "Third part."],
                      meta={"generation": {"guided": True, "finish_reason": "stop", "fate": "ok"}, "model": "m"})
    long = _memory("long", _long_parts(12), meta={"source": {"source": "notes/long.md"},
                                                  "structure": [{"headings": ["Part", f"P{i}"]} for i in range(12)]})
    memories = root / "memories.jsonl"
    write_memories(memories, [hostile, long])
    with memories.open("a", encoding="utf-8") as fh:  # spans that leave a gap: written as is, past the validator
        broken = _memory("broken", ["alpha beta ", "gamma delta ", "epsilon"]).to_dict()
        broken["scenarios"][1]["start"] += 6  # "gamma " is covered by no chunk
        fh.write(json.dumps(broken) + "\n")
    candidates = root / "candidates.jsonl"
    rows = [{"doc_id": "hostile", "unit_id": "hostile", "candidate": j, "clarity": 0.5 - 0.1 * j,
             "completeness": 0.2 + 0.1 * j, "rank_clarity": j + 1, "rank_completeness": 2 - j, "rrf": 0.0325 - 0.001 * j,
             "selected": j == 0, "scores": {"boundaries": [0.4, 0.6]}, "scenarios": 3,
             "spans": [[0, len(HOSTILE)], [len(HOSTILE), len(HOSTILE) + 13], [len(HOSTILE) + 13, len(hostile.document)]]
             if j == 0 else [[0, 20], [20, len(hostile.document)]], "outline": ["a", "b", "c"] if j == 0 else ["x", "y"],
             "fate": "ok"} for j in range(2)]
    candidates.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    gold = root / "gold.jsonl"
    gold.write_text(json.dumps({"id": "hostile", "text": hostile.document, "boundaries": [len(HOSTILE)],
                                "titles": ["intro", "rest"]}) + "\n", encoding="utf-8")
    page = write_view(memories, root / "memories.html", candidates=candidates, gold=gold).path
    return {"memories": memories, "candidates": candidates, "gold": gold, "page": page, "root": root}


def test_the_page_is_self_contained_and_escapes_document_text(files: dict[str, Path]) -> None:
    html = files["page"].read_text(encoding="utf-8")
    assert "<script>window.__pwned" not in html and "</span><script>" not in html
    assert "http://" not in html and "https://" not in html  # nothing to fetch: opens offline
    assert "default-src 'none'" in unescape(html)  # and the page's policy forbids loading anything
    assert json.loads(json_for_script({"t": "</script><!--"})) == {"t": "</script><!--"}
    assert "</script" not in json_for_script({"t": "</script>"})


def test_bad_input_names_the_file_and_what_was_expected(files: dict[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ViewerInputError, match="candidates file: pass it with --candidates"):
        write_view(files["candidates"], tmp_path / "x.html")
    with pytest.raises(ViewerInputError, match="gold-boundary data set"):
        write_view(files["gold"], tmp_path / "x.html")
    (tmp_path / "half.jsonl").write_text('{"doc_id": "a", "document": "x", "scen', encoding="utf-8")
    with pytest.raises(ViewerInputError, match=r"half.jsonl:1 is not valid JSON"):
        write_view(tmp_path / "half.jsonl", tmp_path / "x.html")
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(ViewerInputError, match="holds no memories"):
        write_view(tmp_path / "empty.jsonl")
    assert not (tmp_path / "x.html").exists()
    assert main(["view", str(files["candidates"]), "--out", str(tmp_path / "x.html")]) == 2
    assert "expected a memories JSONL" in capsys.readouterr().err
    assert main(["view", str(files["memories"]), "--candidates", str(files["candidates"]), "--out",
                 str(tmp_path / "cli.html")]) == 0
    out = capsys.readouterr().out
    assert "3 documents, 1 not tiling (marked), 1 with candidates" in out and str(tmp_path / "cli.html") in out


def test_windowed_candidates_are_drawn_at_their_window(tmp_path: Path) -> None:
    from memreader.viewer.documents import Attachments, view_document

    mem = _memory("w", ["a" * 50, "b" * 50], meta={"windows": [{"index": 0, "start": 0, "end": 60},
                                                                {"index": 1, "start": 40, "end": 100}]})
    rows = [{"doc_id": "w", "unit_id": "w#w1", "candidate": 0, "spans": [[0, 10], [10, 60]], "selected": True}]
    doc = view_document(mem, Attachments(candidates={"w": rows}))
    assert doc["cand"][0]["spans"] == [[40, 50], [50, 100]] and doc["cand"][0]["unit"] == "w#w1"


def test_odd_metadata_and_bad_attachments_are_named(tmp_path: Path) -> None:
    from memreader.viewer.documents import view_document

    mem = _memory("s", ["one ", "two"], meta={"structure": [{"pages": [1]}], "source": {"source": "a.pdf"}})
    assert "meta.structure has 1 entries for 2 scenarios" in view_document(mem)["problems"][0]
    mem.meta["structure"].append({"pages": [2], "headings": ["H"]})
    assert view_document(mem)["where"] == ["a.pdf p. 1", "a.pdf p. 2 · H"]
    memories = tmp_path / "m.jsonl"
    write_memories(memories, [mem])
    (tmp_path / "c.jsonl").write_text('{"doc_id": "s", "candidate": 0, "spans": [[0, "x"]]}\n', encoding="utf-8")
    with pytest.raises(ViewerInputError, match=r"c.jsonl:1: spans must be \[start, end\] integer pairs"):
        write_view(memories, candidates=tmp_path / "c.jsonl")
    (tmp_path / "g.jsonl").write_text('{"id": "s", "text": "one two", "boundaries": ["4"]}\n', encoding="utf-8")
    with pytest.raises(ViewerInputError, match="g.jsonl:1 is not a gold document with integer boundaries"):
        write_view(memories, gold=tmp_path / "g.jsonl")
    (tmp_path / "g.jsonl").write_text('{"id": "other", "text": "x", "boundaries": []}\n', encoding="utf-8")
    assert write_view(memories, gold=tmp_path / "g.jsonl").notes == [
        f"no document id of {tmp_path / 'g.jsonl'} is in {memories}: no gold boundaries drawn"]



def test_the_cut_heads_scores_reach_the_page(tmp_path: Path) -> None:
    from memreader.viewer.documents import view_document

    cuts = {"ends": [5, 12, 20], "p": [0.1, 0.9, 0.3], "threshold": 0.4, "breaks": [12], "head": "results/a/cut_head"}
    mem = _memory("c", ["alpha beta. ", "gamma delta. ", "epsilon."], meta={"cuts": cuts, "model": "m"})
    assert view_document(mem)["cuts"] == cuts
    assert "cuts" not in view_document(_memory("n", ["one ", "two"]))
    skewed = _memory("s", ["one ", "two"], meta={"cuts": {**cuts, "p": [0.1, 0.9]}})  # a p per end, or nothing
    assert "cuts" not in view_document(skewed)
    assert "cuts" not in view_document(_memory("l", ["one ", "two"], meta={"cuts": [5, 12]}))
    memories = tmp_path / "m.jsonl"
    write_memories(memories, [mem])
    html = write_view(memories).path.read_text(encoding="utf-8")
    assert json_for_script({"cuts": cuts})[1:-1] in html and "function cutStrip" in html



def test_a_cut_record_without_scores_is_not_drawn() -> None:
    from memreader.viewer.documents import view_document

    for cuts in ({"head": "h", "threshold": 0.5}, {"ends": "abc", "p": "xyz"}):
        assert "cuts" not in view_document(_memory("c", ["one ", "two"], meta={"cuts": cuts})), cuts


def _spans_text(browser: Any) -> str:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#doctext .seg')).map(n => n.textContent).join('')")


def test_in_the_browser_what_a_user_sees(browser: Any, files: dict[str, Path]) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, files["page"])
    assert browser.execute_script("return window.__pwned") is None  # no markup from the text ran
    assert browser.find_element(By.ID, "doctitle").text == "hostile"
    # the spans' text joins to the document exactly, markup shown as written
    assert _spans_text(browser) == HOSTILE + "Second part.\nThird part."
    assert "</span><script>window.__pwned = 1</script>" in browser.find_element(By.ID, "doctext").text
    # the selected candidate is marked, in the table and on its bar; gold is drawn against the memory
    selected = browser.find_elements(By.CSS_SELECTOR, "table.cands tr.selected")
    assert len(selected) == 1 and "★ selected" in selected[0].text and selected[0].get_attribute("data-candidate") == "0"
    assert len(browser.find_elements(By.CSS_SELECTOR, ".barrow")) == 4  # memory, 2 candidates, gold
    assert browser.find_elements(By.CSS_SELECTOR, ".barrow.selected") and browser.find_elements(By.CSS_SELECTOR, ".goldcut")
    # the long document: clicking an outline item scrolls its chunk into view and shows its core
    browser.get(files["page"].resolve().as_uri() + "#doc=long")
    assert browser.find_element(By.ID, "doctitle").text == "long"
    assert _spans_text(browser) == "".join(_long_parts(12))
    assert browser.find_element(By.ID, "outline").get_property("start") == 1  # numbered as a reader counts
    browser.find_elements(By.CSS_SELECTOR, "#outline li")[10].click()
    assert browser.find_element(By.CSS_SELECTOR, "#chunkinfo h3").text.startswith("chunk 11 [")  # the item's number
    chunk = browser.find_element(By.CSS_SELECTOR, '#doctext .chunk[data-i="10"]')
    assert "sel" in chunk.get_attribute("class")
    top = browser.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.top, r.bottom, "
                                 "window.innerHeight]", chunk)
    assert 0 <= top[0] < top[2] and browser.execute_script("return window.scrollY") > 0
    assert "core 10:" in browser.find_element(By.ID, "chunkinfo").text
    assert "notes/long.md · Part > P10" in browser.find_element(By.ID, "chunkinfo").text  # where it came from
    # spans that do not tile: the gap is marked, the problem named, the text still whole
    browser.get(files["page"].resolve().as_uri() + "#doc=broken")
    assert browser.find_element(By.ID, "doctitle").text == "broken"
    assert "gap between span 0" in browser.find_element(By.ID, "problems").text
    assert [g.text for g in browser.find_elements(By.CSS_SELECTOR, "mark.gap")] == ["gamma "]
    assert _spans_text(browser) == "alpha beta gamma delta epsilon"
    # search narrows the document list
    box = browser.find_element(By.ID, "search")
    box.send_keys("brok")
    assert [li.text.split()[0] for li in browser.find_elements(By.CSS_SELECTOR, ".docitem")] == ["broken"]
    assert browser.execute_script("return window.__pwned") is None
    assert console_errors(browser) == []


def test_a_10000_document_file_opens_in_a_few_seconds(browser: Any, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    memories = tmp_path / "big.jsonl"
    write_memories(memories, (_memory(f"doc-{i:05d}", [f"Document {i} opens here. " * 8 + "\n\n",
                                                       "It goes on for a while. " * 12 + "\n\n",
                                                       f"And it ends with number {i}."]) for i in range(10_000)))
    summary = write_view(memories, tmp_path / "big.html")
    seconds = open_page(browser, summary.path)
    assert browser.find_element(By.ID, "doctitle").text == "doc-00000"
    assert browser.find_element(By.ID, "listcount").text.startswith("10000 of 10000 documents")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".docitem")) == 300  # the list is drawn in part
    start = time.perf_counter()
    browser.find_element(By.ID, "search").send_keys("doc-09999")
    # each typed key redraws the list: wait for the last redraw before clicking, or the click can meet an item the
    # next redraw has already replaced (a stale element, seen on a busy CI machine)
    WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "listcount").text.startswith("1 of 10000"))
    browser.find_element(By.CSS_SELECTOR, ".docitem").click()
    WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "doctitle").text == "doc-09999")
    with capsys.disabled():
        print(f"\nviewer: 10,000 documents, {summary.bytes / 1e6:.1f} MB page written in {summary.seconds:.1f} s, "
              f"first render {seconds:.2f} s, search + open {time.perf_counter() - start:.2f} s")
    assert console_errors(browser) == []
