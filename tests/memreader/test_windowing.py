"""Long-document windows: splitting in tokens with overlap, sentence-boundary ends, the merge back into
one tiling memory (random chunkings), planning against the model window, and the too-small-window error."""

from __future__ import annotations

import random
import re
import time

import pytest

from memreader.core.guidance import MemoryGrammars, approx_tokens
from memreader.core.memory_grammar import GrammarSettings
from memreader.core.schema import DocumentMemory, MemoryValidationError, Scenario
from memreader.core.windowing import (
    MARGIN_TOKENS,
    Window,
    WindowError,
    WindowPlan,
    WindowSettings,
    check_windows,
    merge_window_memories,
    plan_windows,
    split_windows,
)

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()


def words(text: str) -> int:
    return len(text.split())


def windowed(plan: WindowPlan) -> list[int]:
    return [d for d, ws in enumerate(plan.windows) if len(ws) > 1]


def make_doc(rng: random.Random, chars: int) -> str:
    out, n = [], 0
    while n < chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 18))).capitalize()
        out.append(sentence + rng.choice([". ", ". ", "! ", ".\n\n", "? "]))
        n += len(out[-1])
    return "".join(out)


def test_windows_cover_the_document_with_overlap_and_respect_the_budget() -> None:
    doc = make_doc(random.Random(1), 6000)
    windows = split_windows(doc, words, 120, 25)
    check_windows(windows, len(doc))  # in order, cover [0, n), overlaps disjoint
    assert len(windows) >= 7
    assert all(words(w.text(doc)) <= 120 for w in windows)
    overlaps = [words(doc[b.start:a.end]) for a, b in zip(windows, windows[1:], strict=False)]
    assert all(0 < o <= 25 for o in overlaps)
    assert sum(overlaps) / len(overlaps) >= 10  # about the requested overlap, less by up to one sentence
    # every window but the last ends after a sentence end (plus its blank), and the next starts at one
    for w in windows[:-1]:
        assert re.search(r"[.!?]\s+$", doc[:w.end]) and not doc[w.end].isspace()
    for w in windows[1:]:
        assert re.search(r"[.!?]\s+$", doc[:w.start])


def test_random_windows_stay_within_budget_with_disjoint_overlaps() -> None:
    for seed in range(400):
        rng = random.Random(seed)
        doc = make_doc(rng, rng.randint(50, 3000))
        budget = rng.randint(32, 120)
        overlap = rng.randint(0, budget // 2 - 1)
        windows = split_windows(doc, words, budget, overlap, max_chars=rng.choice([None, rng.randint(60, 800)]))
        check_windows(windows, len(doc))  # overlaps up to half a window still never reach two windows back
        assert all(words(w.text(doc)) <= budget for w in windows)
        assert all(words(doc[b.start:a.end]) <= overlap for a, b in zip(windows, windows[1:], strict=False))


def test_a_document_that_fits_is_one_window() -> None:
    doc = "Short text. Two sentences."
    assert split_windows(doc, words, 100, 10) == [Window(0, 0, len(doc))]
    assert split_windows(doc, words, None, 10) == [Window(0, 0, len(doc))]
    assert split_windows(doc, words, 100, 10, max_chars=10) != [Window(0, 0, len(doc))]  # the character cap cuts


def test_text_without_boundaries_is_cut_anywhere() -> None:
    doc = "x" * 5000
    windows = split_windows(doc, lambda t: len(t) // 4, 300, 40)
    check_windows(windows, len(doc))
    assert all(len(w.text(doc)) // 4 <= 300 for w in windows)
    assert all(w.end - w.start > 1000 for w in windows[:-1])  # nearly full windows, not scraps
    clause = "word, " * 2000  # no sentence end: clause ends are the next best
    windows = split_windows(clause, words, 100, 10)
    assert all(clause[:w.end].endswith(", ") for w in windows[:-1])


def test_splitting_a_long_document_counts_each_character_a_few_dozen_times() -> None:
    doc = make_doc(random.Random(2), 100_000)
    counted = [0]

    def count(text: str) -> int:
        counted[0] += len(text)
        return words(text)

    t0 = time.perf_counter()
    windows = split_windows(doc, count, 2000, 128)
    assert time.perf_counter() - t0 < 2
    check_windows(windows, len(doc))
    assert counted[0] < 40 * len(doc)  # O(n log window), not O(n²)


def random_memory(rng: random.Random, text: str, doc_id: str = "w") -> DocumentMemory:
    """A random tiling of ``text`` (cuts anywhere, sometimes at blanks) with traceable outlines."""
    n = len(text)
    k = rng.randint(0, min(12, n - 1))
    blanks = [m.end() for m in re.finditer(r"\s+", text) if 0 < m.end() < n]
    pool = blanks if blanks and rng.random() < 0.5 else range(1, n)
    cuts = sorted(set(rng.sample(list(pool), min(k, len(pool)))))
    bounds = [0, *cuts, n]
    scenarios = [Scenario(f"topic {doc_id}/{i}", f"core {i}", s, e) for i, (s, e) in enumerate(zip(bounds, bounds[1:],
                                                                                                      strict=False))]
    return DocumentMemory(doc_id, text, scenarios, meta={"generation": {"guided": True, "fate": "ok",
                                                                         "finish_reason": "stop"}})


def test_merge_tiles_the_document_for_random_windows_and_chunkings() -> None:
    for seed in range(300):
        rng = random.Random(seed)
        doc = make_doc(rng, rng.randint(50, 4000))
        windows = split_windows(doc, words, rng.randint(30, 200), rng.randint(0, 14))
        mems = [random_memory(rng, w.text(doc), f"w{w.index}") for w in windows]
        merged = merge_window_memories("d", doc, windows, mems, {"model": "m"})
        merged.validate()
        assert "".join(merged.chunks) == doc and merged.meta["model"] == "m"
        info = merged.meta["windows"]
        assert [e["kept"][0] for e in info[1:]] == [e["kept"][1] for e in info[:-1]]  # kept parts tile too
        assert sum(e["kept_scenarios"] for e in info) == len(merged.scenarios)
        # every merged scenario is a window chunk, at most clipped at its start by the cut
        by_outline = {sc.outline: (sc.start + w.start, sc.end + w.start)
                      for w, m in zip(windows, mems, strict=True) for sc in m.scenarios}
        for sc in merged.scenarios:
            start, end = by_outline[sc.outline]
            assert end == sc.end and start <= sc.start
            if start < sc.start:
                assert sc.start in [e["kept"][0] for e in info]


def test_merge_cuts_where_both_windows_agree_else_nearest_the_middle() -> None:
    doc = "".join(f"S{i:02d} xxxxx. " for i in range(12))  # 12 sentences of 11 characters
    windows = [Window(0, 0, 88), Window(1, 44, 132)]  # overlap [44, 88]
    first = DocumentMemory("a", doc[:88], [Scenario("a1", "", 0, 55), Scenario("a2", "", 55, 77),
                                            Scenario("a3", "", 77, 88)])
    second = DocumentMemory("b", doc[44:], [Scenario("b1", "", 0, 33), Scenario("b2", "", 33, 88)])
    merged = merge_window_memories("d", doc, windows, [first, second])
    # ends of the first window in the overlap: 55, 77, 88; the second starts a chunk at 44 + 33 = 77
    assert [(s.outline, s.start, s.end) for s in merged.scenarios] == [("a1", 0, 55), ("a2", 55, 77),
                                                                        ("b2", 77, 132)]
    assert merged.meta["windows"][1]["clipped_chars"] == 0
    second = DocumentMemory("b", doc[44:], [Scenario("b1", "", 0, 40), Scenario("b2", "", 40, 88)])
    merged = merge_window_memories("d", doc, windows, [first, second])
    # no agreement: the first window's end nearest the middle (66) is 55; b1 [44, 84) is clipped to [55, 84)
    assert [(s.outline, s.start, s.end) for s in merged.scenarios] == [("a1", 0, 55), ("b1", 55, 84),
                                                                        ("b2", 84, 132)]
    assert merged.meta["windows"][1] | {"generation": None} == {
        "index": 1, "start": 44, "end": 132, "kept": [55, 132], "scenarios": 2, "kept_scenarios": 2,
        "clipped_chars": 11, "generation": None}


def test_merge_aggregates_generation_facts_and_refuses_mismatches() -> None:
    doc = make_doc(random.Random(3), 1500)
    windows = split_windows(doc, words, 100, 10)
    assert len(windows) >= 3
    rng = random.Random(4)
    mems = [random_memory(rng, w.text(doc)) for w in windows]
    mems[1].meta = {"generation": {"guided": False, "fate": "truncated-kept", "finish_reason": "length",
                                   "completion_tokens": 7}, "truncated": True,
                    "fallback": "unparseable output: whole document kept as one chunk", "parse_diagnostics": ["x"]}
    merged = merge_window_memories("d", doc, windows, mems)
    gen = merged.meta["generation"]
    assert gen["guided"] is False and gen["fate"] == "truncated-kept" and gen["finish_reason"] == "length"
    assert gen["windows"] == len(windows) and gen["completion_tokens"] == 7
    assert merged.meta["truncated"] is True and merged.meta["fallback"].startswith("window 1: unparseable")
    assert merged.meta["parse_diagnostics"] == ["window 1: x"]
    with pytest.raises(ValueError, match="not of that window's text"):
        merge_window_memories("d", doc, windows, [mems[0], mems[0], *mems[2:]])
    with pytest.raises(ValueError, match="memories for"):
        merge_window_memories("d", doc, windows, mems[:-1])
    with pytest.raises(ValueError, match="bad windows"):
        merge_window_memories("d", doc, [Window(0, 0, 10)], mems[:1])
    mems[0].scenarios[-1].end -= 1  # a window memory that does not tile its window
    with pytest.raises(MemoryValidationError):
        merge_window_memories("d", doc, windows, mems)


def test_plan_sizes_windows_to_the_model_and_the_grammar() -> None:
    rng = random.Random(5)
    texts = ["A short one. It fits.", make_doc(rng, 20_000), make_doc(rng, 3200)]
    settings = WindowSettings(window_tokens=0, overlap_tokens=20)
    plan = plan_windows(texts, words, settings, prompt_tokens=100, max_new_tokens=300, model_window=1000)
    budget = 1000 - 100 - 300 - MARGIN_TOKENS
    assert plan.budget == budget and not plan.errors and windowed(plan) == [1]  # 3,200 characters fit
    assert plan.windows[0] == [Window(0, 0, len(texts[0]))] and len(plan.windows[2]) == 1
    assert all(words(t) <= budget for t in plan.texts(texts))
    flat = plan.flat()
    assert [d for d, _ in flat] == [0] + [1] * len(plan.windows[1]) + [2]
    # guided: windows also fit one memory grammar (here 6 x 500 characters), and every grammar builds
    grammar = GrammarSettings(max_chunk_chars=500, max_scenarios=6, min_chunk_chars=100)
    plan = plan_windows(texts, words, settings, prompt_tokens=100, max_new_tokens=300, model_window=1000,
                        grammar=grammar)
    assert windowed(plan) == [1, 2] and all(len(t) <= 0.75 * 3000 for t in plan.texts(texts))
    _, errors = MemoryGrammars(grammar, approx_tokens).plan(plan.texts(texts), 1000)
    assert errors == {}
    # no model window known (an HTTP endpoint) and no grammar: no windows at all
    assert windowed(plan_windows(texts, words, settings)) == []


def test_a_window_smaller_than_the_prompt_is_refused_with_the_fix() -> None:
    rng = random.Random(6)
    texts = ["Fits in what is left.", make_doc(rng, 5000)]
    plan = plan_windows(texts, words, WindowSettings(0, 8), prompt_tokens=700, max_new_tokens=280, model_window=1024)
    assert plan.windows[0] == [Window(0, 0, len(texts[0]))]  # short documents still read whole
    assert list(plan.errors) == [1] and plan.windows[1] == [] and plan.flat()[-1][0] == 0
    message = plan.errors[1]
    assert "the window is smaller than the prompt" in message and "prompt 700" in message
    assert "max_new_tokens 280" in message and "fix: lower max_new_tokens" in message
    with pytest.raises(WindowError, match=r"window_tokens=900 does not fit.*at most 440"):
        WindowSettings(900, 8).budget(200, 352, 1024)
    with pytest.raises(WindowError, match="lower overlap_tokens below 50"):
        WindowSettings(0, 50).budget(0, 0, 100 + MARGIN_TOKENS)
    assert WindowSettings(100, 60).problems() and WindowSettings(10, 0).problems()
    assert WindowSettings(0, 500).problems() == []  # auto: checked against the window it gets
