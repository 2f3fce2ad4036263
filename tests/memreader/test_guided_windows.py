"""A window whose memory grammar does not fit the reply budget is cut into smaller windows, not refused
(memreader.core.guidance.plan_guided_windows): small chunks of Chinese text cost many marker tokens."""

from __future__ import annotations

import pytest

from memreader.core import guidance
from memreader.core.guidance import MemoryGrammars, plan_guided_windows
from memreader.core.memory_grammar import GrammarSettings
from memreader.core.windowing import WindowSettings

SENTENCE = "这座城市的图书馆每天早上八点开门，读者可以在一楼借书，也可以在二楼的阅览室安静地学习。"
TEXT = SENTENCE * 36  # ~1,600 characters, as one MultiFieldQA-zh context window


def _plan(budget: int):
    settings = GrammarSettings(min_chunk_chars=160, max_chunk_chars=196, cjk_char_weight=1.0, max_scenarios=8)
    grammars = MemoryGrammars(settings, count_tokens=len)  # one token per character: Chinese-like costs
    return plan_guided_windows([TEXT], grammars, budget, count_tokens=len, settings=WindowSettings(0, 0),
                               grammar=settings)


def test_a_grammar_over_budget_gets_smaller_windows_that_fit() -> None:
    wide, _, errors = _plan(4000)
    assert errors == {} and len(wide.windows[0]) == 1  # a generous budget: one window, as before
    plan, plans, errors = _plan(512)
    assert errors == {}, errors
    windows = plan.windows[0]
    assert len(windows) > 1 and all(p is not None and p.worst_case_tokens <= 512 for p in plans)
    assert windows[0].start == 0 and windows[-1].end == len(TEXT)


def test_a_budget_no_window_fits_is_still_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guidance, "FIT_ROUNDS", 0)  # no re-cut: the window that does not fit is refused
    _, _, errors = _plan(512)
    assert "needs up to" in errors[0] and "raise max_new_tokens" in errors[0]
    _, _, errors = _plan(40)  # not even one chunk fits
    assert errors and all("raise max_new_tokens" in e for e in errors.values())


def test_the_plan_after_the_last_re_cut_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = guidance.plan_windows
    monkeypatch.setattr(guidance, "plan_windows", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    _, _, errors = _plan(512)
    cuts = len(calls) - 1  # re-cuts this document needs
    assert errors == {} and cuts >= 1
    # exactly that many re-cuts allowed: the last one's plan fits and is the one returned (it was once never checked)
    monkeypatch.setattr(guidance, "FIT_ROUNDS", cuts)
    calls.clear()
    _, plans, errors = _plan(512)
    assert errors == {} and len(calls) == cuts + 1 and all(p.worst_case_tokens <= 512 for p in plans)
    monkeypatch.setattr(guidance, "FIT_ROUNDS", cuts - 1)  # one too few: refused with the fix
    _, _, errors = _plan(512)
    assert errors and all("raise max_new_tokens" in e for e in errors.values())


def test_structural_breaks_reach_the_window_that_holds_them() -> None:
    settings = GrammarSettings(min_chunk_chars=160, max_chunk_chars=196, cjk_char_weight=1.0, max_scenarios=8)
    grammars = MemoryGrammars(settings, count_tokens=len)
    breaks = [350, 815]  # a heading in the first window, one in the second (windows are 645 characters)
    plan, plans, errors = plan_guided_windows([TEXT], grammars, 512, [breaks], count_tokens=len,
                                              settings=WindowSettings(0, 0), grammar=settings)
    assert errors == {}
    seen = []
    for (_, w), p in zip(plan.flat(), plans, strict=True):
        seen += [w.start + b for b in p.graph.breaks]  # window offsets back to document offsets
        for s, ends in p.graph.edges.items():
            assert not any(s < b - w.start < e and b - w.start - s >= p.graph.min_chars for b in breaks
                           for e in ends), (w, s)
    # 815 is honoured; 350 is not forced: no chunk of 160-196 characters could follow it inside its window
    assert sorted(seen) == [815]


def test_a_short_text_whose_markers_overflow_is_cut_too() -> None:
    # 344 characters, far below the grammar's capacity (8 x 196 = 1,568), whose 4 chunks need 410 tokens even with
    # 8-token core contents, just over the budget: scaling the capacity by 0.9 x 400 / 410 per re-cut never took
    # it below the text's length in FIT_ROUNDS rounds, so the text was refused (on the full run: a 1,233-character
    # MultiFieldQA-zh context, a table of digits and spaces, needing 522 of 512 tokens)
    short = SENTENCE * 8
    settings = GrammarSettings(min_chunk_chars=44, max_chunk_chars=196, cjk_char_weight=1.0, max_scenarios=8)
    grammars = MemoryGrammars(settings, count_tokens=len)
    plan, plans, errors = plan_guided_windows([short], grammars, 400, count_tokens=len,
                                              settings=WindowSettings(0, 0), grammar=settings)
    assert errors == {}, errors
    assert len(plan.windows[0]) > 1 and all(p is not None and p.worst_case_tokens <= 400 for p in plans)
    assert plan.windows[0][0].start == 0 and plan.windows[0][-1].end == len(short)
