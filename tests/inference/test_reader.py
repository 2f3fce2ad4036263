"""MemReader reading: resumable, crash-safe, fallback counted loudly (scripted backend)."""

from __future__ import annotations

import json
import re

import pytest

from memreader.core.config import ConfigError, load_config
from memreader.core.generation import GenerationRequestError, Reply
from memreader.core.guidance import approx_tokens
from memreader.core.markup import render_memory
from memreader.core.prompts import render
from memreader.core.schema import MemoryValidationError, read_memories
from memreader.core.windowing import MARGIN_TOKENS, prompt_tokens_of
from memreader.inference.reader import ReadConfig, read_corpus_memories


class Backend:
    def __init__(self, fail_after: int | None = None, garbage: bool = False) -> None:
        self.seen: list[str] = []
        self.fail_after, self.garbage = fail_after, garbage
        self.grammars: list[str | None] = []
        self.budgets: list[int] = []

    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None):
        assert (params.temperature, params.top_p, params.repetition_penalty) == (0.1, 0.1, 1.05)
        self.grammars += list(grammars or [None] * len(list_of_messages))
        self.budgets += [params.max_new_tokens] * len(list_of_messages)
        if self.fail_after is not None and len(self.seen) >= self.fail_after:
            raise KeyboardInterrupt  # simulate Ctrl-C in the middle of a run
        outs = []
        for msgs in list_of_messages:
            doc = msgs[-1]["content"].split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]
            self.seen.append(doc)
            cut = doc.index(" ", len(doc) // 2)
            outs.append("garbage" if self.garbage else render_memory(["x", "y"], [doc[:cut], doc[cut:]], ["c", "d"]))
        return outs


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document {i} has words here and there"}) + "\n" for i in range(5)))
    return path


def test_resume_after_interrupt(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cfg = ReadConfig(input=str(corpus), run="r", batch_size=2)
    with pytest.raises(KeyboardInterrupt):
        read_corpus_memories(cfg, backend=Backend(fail_after=2))
    out = tmp_path / "home" / "runs" / "r" / "read" / "memories.jsonl"
    assert [m.doc_id for m in read_memories(out)] == ["d0", "d1"]  # the finished batch was kept
    with out.open("a") as fh:
        fh.write('{"schema_version": 1, "doc_id": "d2", "docu')  # a write cut short by the crash
    backend = Backend()
    summary = read_corpus_memories(cfg, backend=backend)
    assert summary["read"] == 3 and summary["skipped_done"] == 2 and len(backend.seen) == 3
    mems = read_memories(out)
    assert [m.doc_id for m in mems] == ["d0", "d1", "d2", "d3", "d4"]
    assert all("".join(m.chunks) == m.document and len(m.scenarios) == 2 for m in mems)


def test_unusable_output_falls_back_loudly(tmp_path, corpus, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    summary = read_corpus_memories(ReadConfig(input=str(corpus), run="g"), backend=Backend(garbage=True))
    assert summary["fallback_whole_document"] == 5
    assert "WARNING: 5 document(s) had no usable memory output" in capsys.readouterr().out
    assert all(m.meta["fallback"] for m in read_memories(summary["memories"]))


@pytest.mark.integration
def test_transformers_backend_on_tiny_random_model(tmp_path, corpus, tiny_model, monkeypatch) -> None:
    """The real transformers path (chat template, batched generation, parse, align, write) on a
    random 2-layer model: its output is noise, so every memory must be a loud, valid fallback."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cfg = ReadConfig(input=str(corpus), run="tiny", model=tiny_model, backend="transformers", batch_size=3,
                     max_new_tokens=6, limit=3, guided="off", on_truncated="keep_flagged")
    summary = read_corpus_memories(cfg)
    assert summary["read"] == 3
    mems = read_memories(summary["memories"])
    assert [m.doc_id for m in mems] == ["d0", "d1", "d2"]
    for mem in mems:
        assert "".join(mem.chunks) == mem.document
        assert mem.meta["backend"] == "transformers" and mem.meta["prompt"] == "memreader.en@1"
    # 6 tokens from a random model never contain a chunk block: every memory is a flagged fallback,
    # and flagged as cut off (kept only because on_truncated=keep_flagged).
    assert summary["fallback_whole_document"] == 3 and all(m.meta["fallback"] for m in mems)
    assert all(m.meta["truncated"] and m.meta["generation"]["finish_reason"] == "length" for m in mems)


def test_resume_refuses_changed_text_or_settings(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cfg = ReadConfig(input=str(corpus), run="s", batch_size=5)
    read_corpus_memories(cfg, backend=Backend())
    with pytest.raises(MemoryValidationError, match="other settings"):
        read_corpus_memories(ReadConfig(input=str(corpus), run="s", temperature=0.5), backend=Backend())
    lines = corpus.read_text().splitlines()
    lines[1] = json.dumps({"id": "d1", "text": "a different text for document one"})
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(MemoryValidationError, match=r"holds 1 of these documents.*'d1'"):
        read_corpus_memories(cfg, backend=Backend())


def test_failed_requests_are_not_written_and_retried(tmp_path, corpus, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))

    class Flaky(Backend):
        def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                          grammars=None):
            outs = super().generate_many(list_of_messages, params)
            assert return_exceptions
            return [GenerationRequestError("HTTP 500 five times", 500) if "document 3" in d else o
                    for d, o in zip(self.seen[-len(outs):], outs, strict=True)]

    cfg = ReadConfig(input=str(corpus), run="f", batch_size=5)
    summary = read_corpus_memories(cfg, backend=Flaky())
    assert list(summary["failed"]) == ["d3"] and "HTTP 500" in summary["failed"]["d3"] and summary["read"] == 4
    assert "WARNING: 1 document(s) failed" in capsys.readouterr().out
    again = read_corpus_memories(cfg, backend=Backend())
    assert again["read"] == 1 and again["skipped_done"] == 4


def test_guided_reading_sends_one_grammar_per_document(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    backend = Backend()
    summary = read_corpus_memories(ReadConfig(input=str(corpus), run="gd", batch_size=5), backend=backend)
    assert len(backend.grammars) == 5 and all(g and g.startswith("%llguidance") for g in backend.grammars)
    assert "document 3 h[MASK]re and there" in backend.grammars[3]  # built from that document's own text
    mem = read_memories(summary["memories"])[0]
    assert mem.meta["generation"]["grammar"]["single_chunk"] is True  # 37 characters: no boundary in range
    assert summary["single_chunk_no_boundary"] == ["d0", "d1", "d2", "d3", "d4"]
    off = Backend()
    read_corpus_memories(ReadConfig(input=str(corpus), run="gd2", batch_size=5, guided="off"), backend=off)
    assert off.grammars == [None] * 5


def test_cut_off_replies_are_retried_longer_then_skipped(tmp_path, corpus, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))

    class Cut(Backend):
        def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                          grammars=None):
            outs = super().generate_many(list_of_messages, params, grammars=grammars)
            return [Reply(o[:40], finish_reason="length") if "document 1" in d else Reply(o, finish_reason="stop")
                    for d, o in zip(self.seen[-len(outs):], outs, strict=True)]

    backend = Cut()
    cfg = ReadConfig(input=str(corpus), run="cut", batch_size=5, max_new_tokens=300, guided="off")
    summary = read_corpus_memories(cfg, backend=backend)
    assert backend.budgets == [300] * 5 + [600]  # only the cut-off one, once, twice the budget
    assert summary["read"] == 4 and summary["truncated_skipped"] == 1 and summary["fates"]["truncated-skipped"] == 1
    assert "d1" not in [m.doc_id for m in read_memories(summary["memories"])]
    assert "cut off by max_new_tokens=300" in capsys.readouterr().out
    kept = read_corpus_memories(ReadConfig(**{**cfg.__dict__, "run": "cut2", "on_truncated": "keep_flagged"}),
                                backend=Cut())
    flagged = [m for m in read_memories(kept["memories"]) if m.meta.get("truncated")]
    assert [m.doc_id for m in flagged] == ["d1"] and flagged[0].meta["generation"]["fate"] == "truncated-kept"


def test_unguidable_document_is_named_with_the_fix(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path = tmp_path / "long.jsonl"
    long_text = "A sentence of words. " * 200  # 4,200 characters > max_scenarios x max_chunk_chars: windows
    path.write_text(json.dumps({"id": "long", "text": long_text}) + "\n" +
                    json.dumps({"id": "ok", "text": "document ok has words here and there"}) + "\n")
    from memreader.core import guidance

    backend = Backend()
    monkeypatch.setattr(guidance, "FIT_ROUNDS", 1)  # the windows as planned, no smaller ones tried
    summary = read_corpus_memories(ReadConfig(input=str(path), run="u", max_scenarios=2, max_chunk_chars=1000,
                                              max_new_tokens=60), backend=backend)
    # each 1,500-character window needs more than 60 new tokens for its 2 chunks; the short one fits
    assert list(summary["failed"]) == ["long"] and summary["failed"]["long"].startswith("window 0 [0, ")
    assert "raise max_new_tokens" in summary["failed"]["long"]
    assert len(backend.seen) == 1 and summary["read"] == 1  # no model call spent on it
    # with smaller windows tried (the default), the long document is read, not refused
    monkeypatch.setattr(guidance, "FIT_ROUNDS", 4)
    again = read_corpus_memories(ReadConfig(input=str(path), run="u60", max_scenarios=2, max_chunk_chars=1000,
                                            max_new_tokens=60), backend=backend)
    assert again["failed"] == {} and again["read"] == 2 and again["windowed"] == 1


def _long_corpus(tmp_path, n_sentences: int = 120):
    sentences = [f"Sentence {i} tells about topic {i % 7} with several more words." for i in range(n_sentences)]
    text = " ".join(sentences[:40]) + "\n\n" + " ".join(sentences[40:])
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"id": "short", "text": "document ok has words here and there"}) + "\n" +
                    json.dumps({"id": "long", "text": text}) + "\n")
    return path, text


def test_long_document_is_read_window_by_window_and_merged(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path, text = _long_corpus(tmp_path)
    backend = Backend()
    cfg = ReadConfig(input=str(path), run="w", window_tokens=300, overlap_tokens=40)
    summary = read_corpus_memories(cfg, backend=backend)
    assert summary["read"] == 2 and summary["windowed"] == 1 and summary["failed"] == {}
    short, mem = read_memories(summary["memories"])
    assert "windows" not in short.meta and short.meta["generation"]["grammar"] is not None  # read as before
    assert mem.doc_id == "long" and mem.document == text and "".join(mem.chunks) == text
    windows = mem.meta["windows"]
    assert summary["windows"] == len(windows) == len(backend.seen) - 1 >= 5
    asked = dict(zip(backend.seen, backend.grammars, strict=True))  # asked in any order (shortest prompts first)
    for w in windows:
        seen = text[w["start"]:w["end"]]
        assert seen in asked and approx_tokens(seen) <= 300  # each window its own prompt
        assert asked[seen].startswith("%llguidance") and seen[:12] in asked[seen]  # and its own grammar
    assert [w["kept"][0] for w in windows[1:]] == [w["kept"][1] for w in windows[:-1]]
    assert mem.meta["generation"]["windows"] == len(windows) and mem.meta["read_key"] == short.meta["read_key"]
    assert mem.meta["windowing"] == {"budget_tokens": 300, "overlap_tokens": 40}
    assert "1 long document(s) were read in" in capsys.readouterr().out
    with pytest.raises(MemoryValidationError, match="other settings"):  # other windows: refused on resume
        read_corpus_memories(ReadConfig(input=str(path), run="w", window_tokens=300, overlap_tokens=20),
                             backend=Backend())
    again = read_corpus_memories(cfg, backend=Backend())
    assert again["skipped_done"] == 2 and again["read"] == 0


def test_a_failed_or_cut_off_window_holds_back_its_document_only(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path, _ = _long_corpus(tmp_path)

    class Flaky(Backend):
        def __init__(self, cut: bool) -> None:
            super().__init__()
            self.cut = cut

        def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                          grammars=None):
            outs = super().generate_many(list_of_messages, params, grammars=grammars)
            bad = [("Sentence 60 " in d) for d in self.seen[-len(outs):]]
            if self.cut:
                return [Reply(o[:40], finish_reason="length") if b else Reply(o, finish_reason="stop")
                        for o, b in zip(outs, bad, strict=True)]
            return [GenerationRequestError("HTTP 500 five times", 500) if b else o for o, b in zip(outs, bad, strict=True)]

    cfg = ReadConfig(input=str(path), run="fw", window_tokens=300, overlap_tokens=40, guided="off")
    summary = read_corpus_memories(cfg, backend=Flaky(cut=False))
    assert summary["read"] == 1 and summary["windowed"] == 0 and list(summary["failed"]) == ["long"]
    assert re.fullmatch(r"window \d+: HTTP 500 five times", summary["failed"]["long"])
    cut = read_corpus_memories(ReadConfig(**{**cfg.__dict__, "run": "cw"}), backend=Flaky(cut=True))
    assert cut["read"] == 1 and cut["truncated_skipped"] == 1 and cut["fates"] == {"ok": 1, "truncated-skipped": 1}
    again = read_corpus_memories(cfg, backend=Backend())  # the next run asks for the whole document again
    assert again["read"] == 1 and again["windowed"] == 1 and again["skipped_done"] == 1


class WindowedBackend(Backend):
    """A backend that knows its model's window, like transformers and vLLM."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window

    def model_window(self) -> int:
        return self.window


def test_auto_windows_fill_the_model_window(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path, text = _long_corpus(tmp_path)
    backend = WindowedBackend(700)
    summary = read_corpus_memories(ReadConfig(input=str(path), run="a", max_new_tokens=128, guided="off"),
                                   backend=backend)
    assert summary["windowed"] == 1 and summary["windows"] >= 4
    prompts = [render("memreader", "en", document=seen)[0] for seen in backend.seen]
    assert all(prompt_tokens_of(p, backend, approx_tokens) + 128 <= 700 for p in prompts)  # every prompt fits
    mem = {m.doc_id: m for m in read_memories(summary["memories"])}["long"]
    sizes = [approx_tokens(text[w["start"]:w["end"]]) for w in mem.meta["windows"][:-1]]
    assert all(text[w["start"]:w["end"]] in backend.seen for w in mem.meta["windows"])
    assert min(sizes) > 0.8 * max(sizes)  # and the windows (but the last) are filled
    overhead = prompt_tokens_of(render("memreader", "en", document="")[0], backend, approx_tokens)
    assert "".join(mem.chunks) == text
    assert mem.meta["windowing"]["budget_tokens"] == 700 - overhead - 128 - MARGIN_TOKENS >= max(sizes)


def test_a_window_smaller_than_the_prompt_is_named_with_the_fix(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path, _ = _long_corpus(tmp_path)
    overhead = prompt_tokens_of(render("memreader", "en", document="")[0], Backend(), approx_tokens)
    backend = WindowedBackend(overhead + 128 + MARGIN_TOKENS + 20)  # room for 20 document tokens: the short one
    summary = read_corpus_memories(ReadConfig(input=str(path), run="small", max_new_tokens=128), backend=backend)
    assert summary["read"] == 1 and list(summary["failed"]) == ["long"] and len(backend.seen) == 1
    error = summary["failed"]["long"]
    assert "the window is smaller than the prompt" in error and f"prompt {overhead}" in error
    assert "fix: lower max_new_tokens, or use a model (or max_model_len) with a longer window" in error
    with pytest.raises(ConfigError, match="overlap_tokens=64 must be under half of window_tokens=100"):
        load_config(ReadConfig, None, [f"input={path}", "window_tokens=100", "overlap_tokens=64"])


@pytest.mark.integration
def test_guided_reading_on_tiny_random_model_gives_exact_memories(tmp_path, tiny_model, monkeypatch) -> None:
    """A random model cannot follow any format; guided, every output is a valid tiling memory."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path = tmp_path / "c.jsonl"
    text = ("The garden has three compost bays behind the shed. Volunteers turn the piles every week. "
            "In spring the finished compost goes onto the vegetable beds. The school class visits on Fridays. "
            "Last year the garden produced four hundred kilograms of vegetables for the food bank.")
    path.write_text(json.dumps({"id": "g", "text": text}) + "\n")
    cfg = ReadConfig(input=str(path), run="tg", model=tiny_model, backend="transformers", max_new_tokens=400,
                     min_chunk_chars=60, core_tokens=12, topic_tokens=8)
    summary = read_corpus_memories(cfg)
    assert summary["guided"] == 1 and summary["fallback_whole_document"] == 0 and summary["read"] == 1
    mem = read_memories(summary["memories"])[0]
    assert mem.meta["alignment"]["coverage_exact"] == 1.0 and len(mem.scenarios) >= 2
    assert mem.meta["generation"]["guided"] and mem.meta["generation"]["finish_reason"] == "stop"


@pytest.mark.integration
def test_long_document_on_tiny_random_model_is_windowed_to_its_window(tmp_path, tiny_model, monkeypatch) -> None:
    """The real transformers path: the 1,024-token window of the tiny model, its chat template and
    tokenizer size the windows; no window prompt overflows it, and the merged memory tiles the text."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path, text = _long_corpus(tmp_path, n_sentences=260)
    cfg = ReadConfig(input=str(path), run="tw", model=tiny_model, backend="transformers", max_new_tokens=8,
                     guided="off", on_truncated="keep_flagged", overlap_tokens=64)
    summary = read_corpus_memories(cfg)
    assert summary["read"] == 2 and summary["failed"] == {} and summary["windowed"] == 1
    mem = read_memories(summary["memories"])[1]
    assert "".join(mem.chunks) == text and len(mem.meta["windows"]) == summary["windows"] >= 3
    prompts = [w["generation"]["prompt_tokens"] for w in mem.meta["windows"]]
    assert all(p + 8 <= 1024 for p in prompts) and max(prompts) > 850  # filled, never overflowing
    assert mem.meta["truncated"] and mem.meta["generation"]["finish_reason"] == "length"


def test_a_torn_last_line_is_cut_reading_only_the_tail(tmp_path) -> None:
    from memreader.inference.reader import _drop_torn_tail

    path = tmp_path / "m.jsonl"
    whole = json.dumps({"doc_id": "a", "text": "x" * 100_000}) + "\n"
    path.write_text(whole + '{"doc_id": "b", "text": "' + "y" * 70_000, encoding="utf-8")  # torn, over 64 KiB
    _drop_torn_tail(path)
    assert path.read_text(encoding="utf-8") == whole
    path.write_text(whole + '{"doc_id": "c"}', encoding="utf-8")  # complete JSON without its newline: kept
    _drop_torn_tail(path)
    assert path.read_text(encoding="utf-8") == whole + '{"doc_id": "c"}'
    path.write_text('{"doc_id": "only", "te', encoding="utf-8")  # a first line torn
    _drop_torn_tail(path)
    assert path.read_text(encoding="utf-8") == ""
