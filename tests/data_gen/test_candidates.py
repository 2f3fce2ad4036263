"""Multi-path sampling, RRF selection, per-candidate caching and the request flow (scripted teacher,
a scorer computed from the spans; the real evaluator is tested in test_scoring.py)."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass

import pytest

import memreader.data_gen.pipeline as pipeline
from memreader.core.errors import RunFailed
from memreader.core.fusion import RRF_K, RRF_K_MIN, reciprocal_rank_fusion, rrf_k_problem
from memreader.core.generation import GenerationParams, Reply
from memreader.data_gen.flow import Batcher, Dispatcher
from memreader.data_gen.selection import SelectionError, metric_ranks, select_candidates
from tests.data_gen.fakes import DOCS, SeededTeacher
from tests.engine_fakes import fake_engines


@dataclass
class FakeScore:
    clarity: float
    completeness: float

    def to_dict(self):
        return {"clarity": self.clarity, "completeness": self.completeness, "variant": "fake"}


class SpanScorer:
    """Clarity prefers a cut near the middle, completeness a cut near the first third (so they disagree)."""

    def __init__(self) -> None:
        self.scored = 0

    def signature(self):
        return {"fake": 1}

    def score(self, memories):
        self.scored += len(memories)
        out = []
        for m in memories:
            cut = m.scenarios[0].end / len(m.document)
            out.append(FakeScore(round(1 - abs(cut - 0.5), 6), round(1 - abs(cut - 0.33), 6)))
        return out


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    teacher, scorer = SeededTeacher(), SpanScorer()
    fake_engines(monkeypatch, teacher)
    # the evaluator is scripted beneath gen's own construction of it (its settings are still built and checked)
    monkeypatch.setattr("memreader.core.scoring.EvaluatorScorer", lambda settings, **kw: scorer)
    return teacher, scorer


def _rows(manifest):
    return [json.loads(x) for x in open(manifest["files"]["candidates"], encoding="utf-8")]


def test_n_candidates_scored_and_the_best_rrf_kept(corpus, setup) -> None:
    teacher, scorer = setup
    cfg = pipeline.GenConfig(input=str(corpus), run="n4", num_candidates=4, guided="off", val_fraction=0)
    manifest = pipeline.generate(cfg)
    assert teacher.calls == 3 + 12 + 3  # outlines, 4 candidates each, CoM for the winners only
    rows = _rows(manifest)
    assert len(rows) == 12 and scorer.scored == 12
    mems = {m["doc_id"]: m for m in map(json.loads, open(manifest["files"]["memories"], encoding="utf-8"))}
    for doc_id in ("a", "b", "c"):
        mine = [r for r in rows if r["doc_id"] == doc_id]
        assert sorted(r["candidate"] for r in mine) == [0, 1, 2, 3]
        assert sorted(r["rank_clarity"] for r in mine) == [1, 2, 3, 4]
        best = max(mine, key=lambda r: (r["rrf"], -r["candidate"]))
        assert [r["selected"] for r in mine].count(True) == 1 and best["selected"]
        for r in mine:
            assert r["rrf"] == pytest.approx(1 / (60 + r["rank_clarity"]) + 1 / (60 + r["rank_completeness"]))
        kept = mems[doc_id]
        assert [[s["start"], s["end"]] for s in kept["scenarios"]] == best["spans"]
        assert kept["meta"]["selection"]["rrf"] == best["rrf"] and kept["reasoning"]
    # distinct seeds per candidate: candidate 0 samples with the run's seed
    extraction_seeds = [s for (st, *_), s in zip(teacher.seen, teacher.seeds, strict=True) if st == "extraction"]
    assert len(set(extraction_seeds)) == 4 and cfg.seed in extraction_seeds


def test_raising_n_reuses_cached_candidates_and_scores(corpus, setup) -> None:
    teacher, scorer = setup
    cfg = pipeline.GenConfig(input=str(corpus), run="grow", num_candidates=2, guided="off", val_fraction=0,
                             reverse_com=False)
    pipeline.generate(cfg)
    first = {(r["doc_id"], r["candidate"]): r["spans"] for r in _rows(pipeline.generate(cfg))}
    teacher.calls, scorer.scored = 0, 0
    manifest = pipeline.generate(pipeline.GenConfig(**{**cfg.__dict__, "num_candidates": 3}))
    assert teacher.calls == 3  # only candidate 2 of each document is new
    assert scorer.scored == 3 and manifest["selection"]["scores_cached"] == 6
    again = {(r["doc_id"], r["candidate"]): r["spans"] for r in _rows(manifest)}
    assert all(again[k] == v for k, v in first.items())  # the same candidates came back from the cache


def test_single_candidate_is_kept_without_scoring(corpus, setup) -> None:
    _, scorer = setup
    manifest = pipeline.generate(pipeline.GenConfig(input=str(corpus), run="n1", num_candidates=1, guided="off"))
    rows = _rows(manifest)
    assert len(rows) == 3 and all(r["selected"] and r["clarity"] is None for r in rows) and scorer.scored == 0


def test_bad_selection_settings_are_named() -> None:
    from memreader.core.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(pipeline.GenConfig, None, ["input=x.jsonl", "num_candidates=0", "rrf_k=-1",
                                                "clarity_variant=vibes"])
    text = str(err.value)
    assert "num_candidates" in text and "rrf_k" in text and "clarity_variant" in text


def test_ranks_and_ties_are_deterministic() -> None:
    assert metric_ranks([0.2, 0.9, 0.2, None, 0.5]) == [3, 1, 4, 5, 2]  # tie: the earlier candidate first
    rows = select_candidates([{"clarity": 0.5, "completeness": 0.1}, {"clarity": 0.1, "completeness": 0.5}])
    assert rows[0]["rrf"] == rows[1]["rrf"] and rows[0]["selected"] and not rows[1]["selected"]
    rows = select_candidates([{"clarity": 0.5, "completeness": None}, {"clarity": 0.7, "completeness": None}])
    assert rows[1]["selected"] and rows[0]["rank_completeness"] is None and rows[1]["rrf"] == pytest.approx(1 / 61)
    rows = select_candidates([{"clarity": 0.5, "completeness": 0.1}, {"clarity": 0.7, "completeness": 0.0}], k=0)
    assert [r["rrf"] for r in rows] == [1 / 2 + 1 / 1, 1 / 1 + 1 / 2]  # k = 0: ranks start at 1, still defined
    with pytest.raises(SelectionError, match="finite number >= 0"):
        select_candidates([{"clarity": 1.0}], k=-1)
    with pytest.raises(SelectionError, match="finite"):
        select_candidates([{"clarity": float("nan"), "completeness": 1.0}])


@pytest.mark.parametrize("k", [0, 0.5, RRF_K, -1e-9, -1, float("inf"), float("nan")])
def test_gen_selection_and_fusion_agree_on_rrf_k(k: float) -> None:
    """One RRF rule: what `memreader gen` accepts for rrf_k is what selection and fusion run with, and what the
    retrieval configs and momentary settings accept, and `gen --help` states that bound."""
    from memreader.core.config import ConfigError, describe_config, load_config
    from memreader.retrieval.chat import ChatConfig
    from memreader.retrieval.momentary import MomentarySettings
    from memreader.retrieval.search import RetrievalConfig

    def accepts(call) -> bool:
        try:
            call()
        except (ConfigError, ValueError):
            return False
        return True

    fusion = accepts(lambda: reciprocal_rank_fusion([["a", "b"], ["b"]], k=k))
    assert fusion == (rrf_k_problem(k) is None) == (math.isfinite(k) and k >= RRF_K_MIN)
    assert accepts(lambda: select_candidates([{"clarity": 0.5}, {"clarity": 0.7}], k=k)) == fusion
    for cls, needs in ((pipeline.GenConfig, ["input=x.jsonl"]), (RetrievalConfig, []), (ChatConfig, [])):
        assert accepts(lambda cls=cls, needs=needs: load_config(cls, None, [*needs, f"rrf_k={k}"])) == fusion, cls
    assert (not MomentarySettings({"bm25": 1.0}, rrf_k=k).problems()) == fusion
    assert f"(a finite number >= {RRF_K_MIN:g}; usual value {RRF_K:g})" in describe_config(pipeline.GenConfig)


def test_async_dispatcher_keeps_max_concurrency_in_flight() -> None:
    class Slow:
        concurrent_requests = True

        def __init__(self) -> None:
            self.open = self.peak = 0

        async def agenerate(self, messages, params, grammar=None):
            self.open += 1
            self.peak = max(self.peak, self.open)
            await asyncio.sleep(0.01)
            self.open -= 1
            return Reply("ok", finish_reason="stop")

    backend = Slow()

    async def main():
        d = Dispatcher(backend, max_concurrency=8)
        replies = await asyncio.gather(*(d.ask([{"role": "user", "content": str(i)}], GenerationParams())
                                         for i in range(40)))
        return d, replies

    d, replies = asyncio.run(main())
    assert backend.peak == 8 and len(replies) == 40 and d.stats.summary(8)["requests"] == 40


def test_batch_dispatcher_groups_requests_from_many_coroutines() -> None:
    teacher = SeededTeacher()
    calls = []
    original = teacher.generate_many

    def spy(msgs, params, **kw):
        calls.append((len(msgs), params.max_new_tokens, kw["seeds"]))
        return original(msgs, params, **kw)

    teacher.generate_many = spy
    doc = "<document>\nSome text that is long enough to cut.\n</document>"

    async def main():
        d = Dispatcher(teacher, batch_size=3)
        small, big = GenerationParams(max_new_tokens=8), GenerationParams(max_new_tokens=16)
        return await asyncio.gather(*(d.ask([{"role": "user", "content": f"outline {i} {doc}"}],
                                            small if i % 2 else big, seed=i) for i in range(7)))

    replies = asyncio.run(main())
    assert len(replies) == 7 and all(isinstance(r, Reply) for r in replies)
    assert sorted(n for n, *_ in calls) == [1, 3, 3]  # 4 × 16 tokens → 3 + 1, 3 × 8 tokens → 3
    assert sorted(s for *_, seeds in calls for s in seeds) == list(range(7))  # every request kept its seed


def test_batcher_returns_each_submitters_results() -> None:
    seen = []

    def double(items):
        seen.append(len(items))
        return [x * 2 for x in items]

    async def main():
        b = Batcher(double, max_items=4)
        out = await asyncio.gather(b.submit([1, 2]), b.submit([3]), b.submit([4, 5]))
        await b.aclose()
        return out

    assert asyncio.run(main()) == [[2, 4], [6], [8, 10]] and sum(seen) == 5 and max(seen) <= 4


def test_long_document_is_generated_window_by_window_and_merged(tmp_path, setup) -> None:
    teacher, _ = setup
    long_text = " ".join(f"Sentence number {i} talks about topic {i % 7} in some detail." for i in range(60))
    corpus = tmp_path / "long.jsonl"
    corpus.write_text(json.dumps({"id": "long", "text": long_text}) + "\n"
                      + json.dumps({"id": "short", "text": DOCS[0][1]}) + "\n")
    cfg = pipeline.GenConfig(input=str(corpus), run="win", num_candidates=2, guided="off", val_fraction=0,
                             window_tokens=200, overlap_tokens=40)
    manifest = pipeline.generate(cfg)
    n_windows = manifest["windowed"]["long"]
    assert n_windows >= 3 and "short" not in manifest["windowed"]
    mems = {m["doc_id"]: m for m in map(json.loads, open(manifest["files"]["memories"], encoding="utf-8"))}
    long = mems["long"]
    spans = [(s["start"], s["end"]) for s in long["scenarios"]]
    assert spans[0][0] == 0 and spans[-1][1] == len(long_text) and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert [w["index"] for w in long["meta"]["windows"]] == list(range(n_windows))
    units = {r["unit_id"] for r in _rows(manifest) if r["doc_id"] == "long"}
    assert units == {f"long#w{i}" for i in range(n_windows)}
    assert manifest["sft"]["train"] == n_windows + 1  # one SFT record per window, one for the short document
    # each extraction prompt held one window of the long document, never the whole of it
    windows = [w for w in teacher.documents if w in long_text]
    assert windows and max(map(len, windows)) < len(long_text) and long_text not in teacher.documents


def test_window_smaller_than_the_prompt_is_refused_with_the_fix(tmp_path, corpus, setup, monkeypatch) -> None:
    from memreader.core.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="overlap_tokens=100 must be under half"):
        load_config(pipeline.GenConfig, None, ["input=x.jsonl", "window_tokens=150", "overlap_tokens=100"])
    teacher, _ = setup
    teacher.model_window = lambda: 300  # a teacher whose window the prompt and the reply budget fill
    cfg = pipeline.GenConfig(input=str(corpus), run="tiny-window", num_candidates=1, guided="off",
                             max_new_tokens=256)
    with pytest.raises(RunFailed) as err:
        pipeline.generate(cfg)
    assert "the window is smaller than the prompt" in str(err.value) and "lower max_new_tokens" in str(err.value)
    assert teacher.calls == 0  # refused before any call
