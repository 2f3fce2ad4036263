"""Reading through a stream: the engine kept full, each document written the step it finishes, a cut-off reply asked
again while the others go on (scripted engines; the real vLLM stream is in test_vllm.py)."""

from __future__ import annotations

import json

import pytest

from memreader.core.generation import GenerationParams, Reply
from memreader.core.generation.stream import BatchStream, StreamRequest, open_stream
from memreader.core.guidance import approx_tokens
from memreader.core.markup import render_memory
from memreader.core.prompts import render
from memreader.core.schema import read_memories
from memreader.core.windowing import prompt_tokens_of
from memreader.inference.reader import ReadConfig, read_corpus_memories


def _document(messages) -> str:
    return messages[-1]["content"].split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]


def _memory(doc: str) -> str:
    cut = doc.index(" ", len(doc) // 2)
    return render_memory(["x", "y"], [doc[:cut], doc[cut:]], ["c", "d"])


class StepEngine:
    """An engine that decodes its requests together, one token a step: a request ends after as many steps as its
    document has words (a few get cut off once at their first budget). Records how many requests ran each step."""

    def __init__(self, cut: frozenset[str] = frozenset(), stop_after: int | None = None) -> None:
        self.cut, self.stop_after = cut, stop_after
        self.running_per_step: list[int] = []
        self.asked_before_step: list[int] = []
        self.asked: list[tuple[str, int]] = []  # (document, max_new_tokens) as submitted
        self.closed_with = None

    def stream(self, window: int) -> StepStream:
        return StepStream(self, window)


class StepStream:
    def __init__(self, engine: StepEngine, window: int) -> None:
        self.engine, self.window = engine, window
        self.running: dict[int, list] = {}  # id → [tag, doc, steps left, params]
        self._ids = 0

    @property
    def pending(self) -> int:
        return len(self.running)

    def submit(self, request: StreamRequest) -> None:
        doc = _document(request.messages)
        self.engine.asked.append((doc, request.params.max_new_tokens))
        self._ids += 1
        self.running[self._ids] = [request.tag, doc, len(doc.split()), request.params]

    def step(self) -> list:
        engine = self.engine
        if engine.stop_after is not None and len(engine.running_per_step) >= engine.stop_after:
            raise KeyboardInterrupt  # Ctrl-C while documents are in flight
        engine.running_per_step.append(len(self.running))
        engine.asked_before_step.append(len(engine.asked))
        done = []
        for rid, entry in list(self.running.items()):
            entry[2] -= 1
            if entry[2] == 0:
                tag, doc, _, params = self.running.pop(rid)
                first = params.max_new_tokens == 512
                cut = doc.split()[0] in engine.cut and first
                done.append((tag, Reply(_memory(doc)[:30] if cut else _memory(doc),
                                        finish_reason="length" if cut else "stop")))
        return done

    def close(self) -> None:
        self.engine.closed_with = len(self.running)
        self.running.clear()


@pytest.fixture()
def corpus(tmp_path):
    """12 documents of 3 to 14 words: a long one every fourth, so fixed groups would wait on it."""
    path = tmp_path / "c.jsonl"
    lines = []
    for i in range(12):
        n = 14 if i % 4 == 0 else 3 + i % 3
        lines.append(json.dumps({"id": f"d{i:02d}", "text": f"w{i} " + " ".join(f"word{j}" for j in range(n - 1))}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_engine_is_kept_full_and_documents_are_written_as_they_finish(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    engine = StepEngine()
    summary = read_corpus_memories(ReadConfig(input=str(corpus), run="s", batch_size=4, guided="off"), backend=engine)
    assert summary["read"] == 12 and summary["failed"] == {}
    mems = read_memories(summary["memories"])
    assert all("".join(m.chunks) == m.document for m in mems)
    # topped up after every step: 4 requests run every step until the corpus has no document left to add
    steps_full = [n for n, asked in zip(engine.running_per_step, engine.asked_before_step, strict=True) if asked < 12]
    assert len(steps_full) > 5 and all(n == 4 for n in steps_full)
    # appended as they finished (the short d01 before the long d00 asked first), then put in corpus order at the end
    assert [m.doc_id for m in mems] == [f"d{i:02d}" for i in range(12)]
    # fixed groups of 4 would take 14 steps per group (each waits on its 14-word document): 42 steps
    assert len(engine.running_per_step) < 42


def test_an_interrupt_keeps_every_finished_document_and_the_rerun_reads_the_rest(tmp_path, corpus, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cfg = ReadConfig(input=str(corpus), run="i", batch_size=4, guided="off")
    engine = StepEngine(stop_after=8)
    with pytest.raises(KeyboardInterrupt):
        read_corpus_memories(cfg, backend=engine)
    out = tmp_path / "home" / "runs" / "i" / "read" / "memories.jsonl"
    kept = [m.doc_id for m in read_memories(out)]
    assert len(kept) >= 4 and "d00" not in kept  # the short ones finished in 8 steps; the long d00 had not
    assert engine.closed_with == 4  # the requests still in flight were taken out of the engine
    again = StepEngine()
    summary = read_corpus_memories(cfg, backend=again)
    assert summary["skipped_done"] == len(kept) and summary["read"] == 12 - len(kept)
    assert {d.split()[0] for d, _ in again.asked} == {f"w{i}" for i in range(12) if f"d{i:02d}" not in kept}
    assert sorted(m.doc_id for m in read_memories(out)) == [f"d{i:02d}" for i in range(12)]


def test_a_cut_off_reply_goes_back_in_with_twice_the_budget_while_the_others_go_on(tmp_path, corpus,
                                                                                   monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    engine = StepEngine(cut=frozenset({"w1"}))
    summary = read_corpus_memories(ReadConfig(input=str(corpus), run="c", batch_size=4, guided="off",
                                              max_new_tokens=512), backend=engine)
    assert summary["read"] == 12 and summary["fates"] == {"ok": 11, "retried": 1} and summary["asked_again"] == 1
    assert [(d.split()[0], b) for d, b in engine.asked if d.startswith("w1 ")] == [("w1", 512), ("w1", 1024)]
    second = next(i for i, (d, b) in enumerate(engine.asked) if b == 1024)
    assert second < len(engine.asked) - 1  # asked again before the corpus ran out: the others did not wait
    mem = {m.doc_id: m for m in read_memories(summary["memories"])}["d01"]
    assert mem.meta["generation"]["fate"] == "retried" and "".join(mem.chunks) == mem.document


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None, **kw):
        self.calls.append({"prompts": [m[-1]["content"] for m in list_of_messages], "budget": params.max_new_tokens,
                           "grammars": grammars, **kw})
        return [Reply(m[-1]["content"].upper(), finish_reason="stop") for m in list_of_messages]


def test_a_batch_stream_runs_the_shortest_prompts_of_one_setting_first() -> None:
    backend = Recorder()
    stream = open_stream(backend, 2, window=8)
    assert isinstance(stream, BatchStream) and stream.window == 8  # four batches to choose each batch from
    assert open_stream(backend, 2).window == 2  # by default: one batch, in the order submitted
    p, longer = GenerationParams(max_new_tokens=10), GenerationParams(max_new_tokens=20)
    for i, (text, params) in enumerate([("ccc", p), ("a", longer), ("bbbb", p), ("dd", p)]):
        stream.submit(StreamRequest(i, [{"role": "user", "content": text}], params, grammar=None))
    assert stream.pending == 4
    first = stream.step()
    assert first == [(3, "DD"), (0, "CCC")] and backend.calls[0]["budget"] == 10  # the oldest request's settings
    assert "seeds" not in backend.calls[0]  # no seed given: the backend seeds from the settings
    assert stream.step() == [(1, "A")] and backend.calls[1]["budget"] == 20  # now the oldest
    assert stream.step() == [(2, "BBBB")] and stream.pending == 0
    stream.submit(StreamRequest(9, [{"role": "user", "content": "x"}], p, grammar="start: \"X\"", seed=5))
    assert stream.step() == [(9, "X")] and backend.calls[-1]["seeds"] == [5]
    assert backend.calls[-1]["grammars"] == ['start: "X"']
    with pytest.raises(ValueError, match="messages"):
        stream.submit(StreamRequest(0, [], p))


class SmallCache(StepEngine):
    """The same engine with a KV cache that holds ``capacity`` tokens."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def kv_capacity_tokens(self) -> int:
        return self.capacity


def test_a_batch_larger_than_the_cache_holds_runs_with_fewer_requests_and_says_so(tmp_path, corpus, monkeypatch,
                                                                                  capsys) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    cfg = ReadConfig(input=str(corpus), run="m", batch_size=6, guided="off", max_new_tokens=100)
    engine = SmallCache(0)
    engine.capacity = 10**9  # first a cache that holds everything: 6 at once
    read_corpus_memories(cfg, backend=engine)
    assert max(engine.running_per_step) == 6
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    per_request = [prompt_tokens_of(render("memreader", "en", document=t)[0], engine, approx_tokens) + 100
                   for t in texts]  # prompt + reply budget
    small = SmallCache(2 * max(per_request) + 1)  # room for any two requests, never for three
    assert 3 * min(per_request) > small.capacity
    summary = read_corpus_memories(ReadConfig(**{**cfg.__dict__, "run": "m2"}), backend=small)
    assert summary["read"] == 12 and max(small.running_per_step) == 2
    limit = summary["memory_limit"]
    assert limit["in_flight"] == 2 and limit["capacity_tokens"] == small.capacity
    assert min(per_request) <= limit["tokens_per_request"] <= max(per_request)
    out = capsys.readouterr().out
    assert "NOTE: batch_size=6 is more than memory holds here" in out and f"{small.capacity:,} tokens" in out
    assert "as few as 2 ran at once" in out and "lower max_new_tokens" in out
    lone = SmallCache(10)  # not even one request fits: each still runs alone, never refused
    summary = read_corpus_memories(ReadConfig(**{**cfg.__dict__, "run": "m3"}), backend=lone)
    assert summary["read"] == 12 and max(lone.running_per_step) == 1


def test_a_kv_cache_larger_than_free_memory_is_refused_with_the_measured_limit() -> None:
    from memreader.core.config import ConfigError
    from memreader.core.kv_budget import GiB, check_kv_cache_gib, kv_bytes_per_token

    check_kv_cache_gib(2.0, free=4 * GiB)  # 2 of 4 GiB: fine
    with pytest.raises(ConfigError, match=r"kv_cache_gib: 10 GiB .* 4\.0 GiB free now.*set kv_cache_gib=3 or less"):
        check_kv_cache_gib(10.0, free=4 * GiB)

    class Config:  # SmolLM2-135M's shape: 30 layers, 9 heads of 64, 3 key/value heads
        num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 30, 9, 3, 576

    assert kv_bytes_per_token(Config, 2) == 2 * 30 * 3 * 64 * 2 == 23_040


def test_a_transformers_model_gets_half_the_free_memory_in_tokens() -> None:
    import torch

    from memreader.core.kv_budget import GiB, local_kv_capacity_tokens

    class Model:  # SmolLM2-135M's shape in fp32
        class config:  # noqa: N801
            num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 30, 9, 3, 576

        def parameters(self):
            yield torch.zeros(1, dtype=torch.float32)

    assert local_kv_capacity_tokens(Model(), free=8 * GiB) == 4 * GiB // (2 * 30 * 3 * 64 * 4)  # 93,206 tokens


def test_cut_ahead_scores_documents_ahead_in_a_worker_thread_in_order() -> None:
    """The head's prefill for the next documents runs in one worker thread while the engine works on the earlier
    ones; the documents come back in order, each with its own result, at most ``depth`` scored ahead; an error in the
    head surfaces at its document; depth 0 (or no head) scores nothing here."""
    import threading

    from memreader.core.corpus import Document
    from memreader.inference.reading import cut_ahead

    docs = [Document(doc_id=str(i), text=f"text {i}") for i in range(6)]
    seen: list[tuple[str, str]] = []

    def cutter(text: str):
        seen.append((text, threading.current_thread().name))
        if text == "text 4":
            raise ValueError("head broke on text 4")
        return [len(text)], {"text": text}

    got = []
    stream = cut_ahead(iter(docs), cutter, depth=2)
    doc, cuts = next(stream)
    assert doc.doc_id == "0" and cuts == ([6], {"text": "text 0"})
    assert len(seen) <= 3 and all(name.startswith("cut-head") for _, name in seen)  # 0 plus at most 2 ahead
    got.append(doc.doc_id)
    with pytest.raises(ValueError, match="head broke on text 4"):
        for doc, cuts in stream:
            assert cuts[1]["text"] == doc.text
            got.append(doc.doc_id)
    assert got == ["0", "1", "2", "3"]
    assert [(d.doc_id, c) for d, c in cut_ahead(iter(docs[:2]), cutter, depth=0)] == [("0", None), ("1", None)]
    assert [(d.doc_id, c) for d, c in cut_ahead(iter(docs[:2]), None)] == [("0", None), ("1", None)]


def test_cut_ahead_auto_scores_in_turn_beside_a_cpu_engine_and_ahead_beside_a_gpu_or_server() -> None:
    from memreader.inference.reader import cut_ahead_depth

    assert cut_ahead_depth(-1, {"backend": "vllm", "device": "cpu"}) == 0  # measured: they compete for the cores
    assert cut_ahead_depth(-1, {"backend": "transformers", "device": "cpu"}) == 0
    assert cut_ahead_depth(-1, {"backend": "vllm", "device": "cuda"}) == 2
    assert cut_ahead_depth(-1, {}) == 2  # an OpenAI-compatible server: the CPU waits on HTTP
    assert cut_ahead_depth(3, {"backend": "vllm", "device": "cpu"}) == 3  # a setting wins
