"""``memreader measure-engines``: every backend x dtype, side by side on the same inputs, on the machine it runs on;
records the fastest per stage, which ``backend: auto`` and ``dtype: auto`` then read (docs/ENGINES.md).

    memreader measure-engines                                  # the demo corpus, every row and stage; records
    memreader measure-engines --set extra=../shared/datasets/crud_event_summary.jsonl --set extra_docs=4
    memreader measure-engines --set stages=[verifier,chat] --no-record --out engines.json

Each row (``rows``: backend:dtype on ``model``) starts its engine and times every stage on the same inputs
(:func:`bench_row`; vLLM with prefix caching off, so every row computes every token). The fastest row per stage goes
to ``$MEMREADER_HOME/engine_choice.json`` for this machine (``record``); the command then resolves ``auto`` per stage
and fails if it does not give that row.
"""
from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from importlib.resources import files
from itertools import product
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.registry import SMOLLM2
from memreader.core.stage import Flag, Stage

QUESTIONS = ["How many compost bays are there?", "Who meets in the old hall?", "What did the club write last year?",
             "Where does the trip go?", "What is stored behind the tool shed?", "When does the club meet?"]
STAGE_KEYS = {  # stage -> (row section, metric, +1 higher is faster / -1 lower is faster)
    "read": ("reading", "docs_per_s_with_startup", 1), "teacher": ("reading", "docs_per_s_with_startup", 1),
    "scorer": ("scoring", "tok_per_s", 1), "answer": ("answering", "answers_per_s", 1),
    "support": ("support", "tok_per_s", 1), "verifier": ("verifier", "passages_per_s", 1),
    "chat": ("chat", "s_per_reply", -1)}
COLUMNS = {("reading", "docs_per_s"): ("read doc/s", ".3f"), ("reading", "docs_per_s_with_startup"): ("+start", ".3f"),
           ("reading", "tok_per_s"): ("gen tok/s", ".0f"), ("reading", "usable_rate"): ("usable", ".0%"),
           ("scoring", "tok_per_s"): ("scorer tok/s", ".0f"), ("answering", "prefill_tok_per_s"): ("ans prefill", ".0f"),
           ("answering", "answers_per_s"): ("ans/s", ".2f"), ("support", "tok_per_s"): ("supp tok/s", ".0f"),
           ("support", "share_of_matmul"): ("supp %mm", ".0%"), ("verifier", "passages_per_s"): ("verif p/s", ".1f"),
           ("chat", "s_per_reply"): ("chat s/reply", ".2f")}
ROW_CHOICES = {"backend": ("transformers", "vllm"), "dtype": ("float32", "bfloat16")}


@dataclass
class EngineSpeedConfig:
    """What ``memreader measure-engines`` runs and records."""

    rows: list = field(["transformers:float32", "transformers:bfloat16", "vllm:float32", "vllm:bfloat16"],
                       help="backend:dtype rows, measured one after another (backends transformers, vllm; dtypes "
                       "float32, bfloat16)")
    stages: list = field(list(STAGE_KEYS), help="stages to measure and record (without read, the QA contexts are "
                         "the corpus cut into ~300-character chunks)")
    model: str = field(SMOLLM2, help="the model every row runs (a registry name or a folder)")
    corpus: str = field("", help="documents to read, {id, text} JSONL (default: the demo corpus, 8 documents)")
    extra: str = field("", help="more documents, JSONL with a 'text' field (e.g. "
                       "../shared/datasets/crud_event_summary.jsonl)")
    extra_docs: int = field(50, ge=0, help="how many documents of 'extra' to add")
    record: bool = field(True, help="write the fastest rows to $MEMREADER_HOME/engine_choice.json")
    out: str = field("", help="also write the rows, rates and choices as JSON here")

    def problems(self) -> list[str]:
        """Rows and stages that do not exist, and input files that are not there."""
        found = [f"rows: {r!r} is not backend:dtype with backend in {ROW_CHOICES['backend']} and dtype in "
                 f"{ROW_CHOICES['dtype']}" for r in self.rows
                 if r.count(":") != 1 or tuple(r.split(":")) not in product(*ROW_CHOICES.values())]
        unknown = sorted(set(self.stages) - set(STAGE_KEYS))
        if unknown or not self.stages:
            found.append(f"stages: unknown {unknown}; choose from {', '.join(STAGE_KEYS)}")
        if not self.rows:
            found.append("rows: give at least one backend:dtype row")
        found += [f"{key}: {path} is not a file" for key, path in (("corpus", self.corpus), ("extra", self.extra))
                  if path and not Path(path).is_file()]
        return found


def _corpus(cfg: EngineSpeedConfig, path: Path) -> Path:
    """``cfg.corpus`` (the demo corpus by default) with ``cfg.extra_docs`` documents of ``cfg.extra``, as one file."""
    main = Path(cfg.corpus) if cfg.corpus else files("memreader") / "demo_data" / "corpus.jsonl"
    rows = [json.loads(line) for line in main.read_text(encoding="utf-8").splitlines() if line.strip()]
    if cfg.extra:
        with open(cfg.extra, encoding="utf-8") as f:
            for i, line in zip(range(cfg.extra_docs), f, strict=False):
                rows.append({"id": f"extra-{i:03d}", "text": json.loads(line)["text"]})
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def model_flops_per_token(config: Any, seq_len: int) -> float:
    """2 x non-embedding parameters of a Llama-shaped decoder, plus causal attention (QK^T and AV) at ``seq_len``."""
    d, layers, heads, kv = config.hidden_size, config.num_hidden_layers, config.num_attention_heads, \
        config.num_key_value_heads
    head_dim = d // heads
    per_layer = d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d + 3 * d * config.intermediate_size
    attention = 2 * 2 * layers * heads * head_dim * seq_len / 2  # causal: half the positions on average
    return 2.0 * per_layer * layers + attention


def bench_reading(chat: Any, backend: str, dtype: str, corpus_path: Path, work: Path) -> dict[str, Any]:
    """Guided reading of the corpus on the row's engine."""
    from memreader.core.corpus import read_corpus
    from memreader.core.schema import read_memories
    from memreader.inference.reader import ReadConfig, read_documents

    cfg = ReadConfig(input=str(corpus_path), run="bench", backend=backend, dtype=dtype, batch_size=8,
                     max_new_tokens=512)
    docs = read_corpus(corpus_path)
    out = work / f"read-{backend}-{dtype}"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = read_documents(cfg, docs, out, backend=chat)
    seconds = time.perf_counter() - t0
    memories = read_memories(out / "memories.jsonl")
    tokens = sum((g.get("generation", {}).get("completion_tokens") or 0)
                 for m in memories for g in (m.meta, *m.meta.get("windows", [])))
    usable = sum(1 for m in memories if m.meta.get("generation", {}).get("guided", True) and len(m.scenarios) >= 2
                 and "fallback" not in m.meta)
    return {"documents": len(docs), "read": summary["read"], "seconds": round(seconds, 1), "tokens": tokens,
            "docs_per_s": len(docs) / seconds, "tok_per_s": tokens / seconds, "usable_rate": usable / len(docs),
            "memories": memories}


def sentence_memories(corpus_path: Path) -> list[Any]:
    """The corpus cut after sentences into ~300-character chunks (the QA contexts when ``read`` is not measured)."""
    from memreader.core.corpus import read_corpus
    from memreader.core.schema import DocumentMemory, Scenario

    out = []
    for doc in read_corpus(corpus_path):
        cuts, start = [], 0
        for m in re.finditer(r"(?<=[.!?])\s+", doc.text):
            if m.end() - start >= 300:
                cuts.append(start := m.end())
        spans = [(a, b) for a, b in zip([0, *cuts], [*cuts, len(doc.text)], strict=True) if b > a]
        out.append(DocumentMemory(doc.doc_id, doc.text, [Scenario(f"part {i}", "", a, b) for i, (a, b) in enumerate(spans)]))
    return out


def qa_items(memories: list[Any]) -> tuple[list[str], list[list[str]], list[str]]:
    """24 questions, each with 8 retrieved-size chunks (as eval gives) and a reference answer from the chunks."""
    chunks = [c for m in memories for c in m.chunks]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(24)]
    contexts = [[chunks[(i * 3 + k) % len(chunks)] for k in range(8)] for i in range(24)]
    return questions, contexts, [chunks[(i * 5) % len(chunks)][:80] for i in range(24)]


def bench_row(cfg: EngineSpeedConfig, spec: str, corpus_path: Path, work: Path, shared: dict[str, Any],
              rates: dict[str, float]) -> dict[str, Any]:
    """One backend:dtype row: every stage of ``cfg.stages`` on one engine."""
    from memreader.core.engines import make_engine, resolve_engine
    from memreader.eval.answering import answer_messages

    backend, dtype = spec.split(":")
    print(f"--- {backend} {dtype}", flush=True)
    t0 = time.perf_counter()
    # prefix caching off (vLLM): every row computes every prompt token (the QA prompts share chunks, and support
    # scores the prompts just answered, which vLLM's cache would serve; real runs keep it on)
    chat: Any = make_engine(resolve_engine("read", backend, dtype), cfg.model, batch_size=8, max_model_len=8192,
                            prefix_caching=False)
    if backend == "transformers":
        chat.model()
    startup = time.perf_counter() - t0
    row: dict[str, Any] = {"backend": backend, "dtype": dtype, "startup_s": round(startup, 1)}
    if "read" in cfg.stages or "teacher" in cfg.stages:
        reading = bench_reading(chat, backend, dtype, corpus_path, work)
        shared.setdefault("memories", reading.pop("memories"))  # every row scores and answers the first row's
        reading["docs_per_s_with_startup"] = reading["documents"] / (reading["seconds"] + startup)
        row["reading"] = reading
    if "memories" not in shared:
        shared["memories"] = sentence_memories(corpus_path)
    if "scorer" in cfg.stages:
        row["scoring"] = bench_scoring(chat, backend, dtype, shared["memories"])
    questions, contexts, answers = qa_items(shared["memories"])
    prompts = [answer_messages(q, c) for q, c in zip(questions, contexts, strict=True)]
    if {"answer", "support"} & set(cfg.stages):
        row.update(bench_answering(chat, cfg.model, dtype, prompts, (questions, contexts, answers), rates))
    if "verifier" in cfg.stages:
        row["verifier"] = bench_verifier(chat, backend, questions, contexts)
    if "chat" in cfg.stages:
        row["chat"] = bench_chat(chat, prompts)
    if backend == "vllm":
        from memreader.core.vllm_engine import shutdown_engines

        shutdown_engines()
    return row


def bench_scoring(chat: Any, backend: str, dtype: str, memories: list[Any]) -> dict[str, Any]:
    """The evaluator scorer (``ppl`` clarity + completeness) over ``memories``: prompt tokens/s."""
    from memreader.core.scoring import EvaluatorScorer, ScorerSettings

    if backend == "vllm":
        scorer = EvaluatorScorer(ScorerSettings(evaluator_backend="vllm", evaluator_dtype=dtype), engine=chat.engine)
    else:
        scorer = EvaluatorScorer(ScorerSettings(evaluator_dtype=dtype), chat.model(), chat.tokenizer())
    before, t0 = scorer.engine.tokens_processed, time.perf_counter()
    scorer.score(memories, ["ppl"])
    dt, tokens = time.perf_counter() - t0, scorer.engine.tokens_processed - before
    return {"tokens": tokens, "seconds": round(dt, 2), "tok_per_s": tokens / dt}


def bench_answering(chat: Any, model: str, dtype: str, prompts: list[Any], qa: tuple[list, list, list],
                    rates: dict[str, float]) -> dict[str, Any]:
    """Answering (prefill alone, then 32-token answers) and the support of the reference answers."""
    from transformers import AutoConfig

    from memreader.core.generation import GenerationParams
    from memreader.core.registry import resolve_model
    from memreader.eval.support import support_for_answers

    tok = chat.tokenizer()
    prompt_tokens = sum(len(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)
                            ["input_ids"]) for p in prompts)
    seconds = []
    for new_tokens in (1, 32):
        t0 = time.perf_counter()
        chat.generate_many(prompts, GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=new_tokens))
        seconds.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    scores = support_for_answers(chat, *qa)
    dt = time.perf_counter() - t0
    seq_tokens = prompt_tokens + sum(s.n_tokens for s in scores)
    config = AutoConfig.from_pretrained(resolve_model(model))
    flops = model_flops_per_token(config, int(seq_tokens / len(scores))) * seq_tokens / dt
    prefill_flops = model_flops_per_token(config, int(prompt_tokens / len(prompts))) * prompt_tokens / seconds[0]
    return {"answering": {"prompts": len(prompts), "prompt_tokens": prompt_tokens,
                          "prefill_tok_per_s": prompt_tokens / seconds[0], "answers_per_s": len(prompts) / seconds[1],
                          "share_of_matmul": prefill_flops / 1e9 / rates[dtype]},
            "support": {"tokens": seq_tokens, "seconds": round(dt, 2), "tok_per_s": seq_tokens / dt,
                        "model_gflops": flops / 1e9, "share_of_matmul": flops / 1e9 / rates[dtype]}}


def bench_verifier(chat: Any, backend: str, questions: list[str], contexts: list[list[str]]) -> dict[str, Any]:
    """MeVe's LM verifier: P(yes) of every (question, retrieved chunk) pair, 24 questions x 8 chunks."""
    from memreader.retrieval.verifier import LMVerifier

    verifier = LMVerifier(chat.engine if backend == "vllm" else chat.model(), chat.tokenizer())
    t0 = time.perf_counter()
    for q, c in zip(questions, contexts, strict=True):
        verifier.score(q, c)
    dt = time.perf_counter() - t0
    pairs = sum(len(c) for c in contexts)
    return {"passages": pairs, "seconds": round(dt, 2), "passages_per_s": pairs / dt}


def bench_chat(chat: Any, prompts: list[Any]) -> dict[str, Any]:
    """The chat: 6 of the QA prompts one at a time (as a conversation asks), 32 new tokens: seconds per reply."""
    from memreader.core.generation import GenerationParams

    t0 = time.perf_counter()
    for p in prompts[:6]:
        chat.generate_many([p], GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=32))
    dt = time.perf_counter() - t0
    return {"replies": 6, "seconds": round(dt, 2), "s_per_reply": dt / 6}


def measure_engines(cfg: EngineSpeedConfig) -> int:
    """Measure every row, print the table and the fastest row per stage, record them (``cfg.record``) and check that
    ``auto`` now resolves to them; 1 when it does not."""
    import torch

    from memreader.core.engines import machine_key, record_choices, resolve_engine
    from memreader.core.hardware import cpu_model, matmul_rate

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"machine: {machine_key()} ({cpu_model()}), {torch.get_num_threads()} threads, device {device}")
    rates = {d: max(matmul_rate(d, 1024), matmul_rate(d, 2048)) for d in ROW_CHOICES["dtype"]}
    print(f"matmul: fp32 {rates['float32']:.0f} GFLOP/s, bf16 {rates['bfloat16']:.0f} GFLOP/s")
    rows: list[dict[str, Any]] = []
    shared: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = _corpus(cfg, Path(tmp) / "corpus.jsonl")
        for spec in cfg.rows:
            rows.append(bench_row(cfg, spec, corpus_path, Path(tmp), shared, rates))
            print("row:", json.dumps(rows[-1], default=float), flush=True)  # kept even if a later row fails
    print()
    for r in rows:
        cells = [f"{r['backend']} {r['dtype']}", f"start-up {r['startup_s']:.1f} s"]
        cells += [f"{name} {format(r[section][metric], fmt)}" for (section, metric), (name, fmt) in COLUMNS.items()
                  if section in r]
        print(" | ".join(cells))
    best = {stage: max(rows, key=lambda r, k=key: r[k[0]][k[1]] * k[2])
            for stage, key in STAGE_KEYS.items() if stage in cfg.stages and all(key[0] in r for r in rows)}
    choices = {stage: {"backend": r["backend"], "dtype": r["dtype"], "measured": time.strftime("%Y-%m-%d"),
                       "by": f"memreader measure-engines ({cfg.model})"} for stage, r in best.items()}
    for stage, c in choices.items():
        print(f"fastest {stage}: {c['backend']} {c['dtype']}")
    if cfg.out:
        Path(cfg.out).write_text(json.dumps({"machine": machine_key(), "matmul_gflops": rates, "rows": rows,
                                             "choices": choices}, indent=2, default=float) + "\n", encoding="utf-8")
    if not cfg.record:
        return 0
    print(f"recorded -> {record_choices(choices)}")
    wrong = 0
    for stage, c in choices.items():
        choice = resolve_engine(stage)
        ok = (choice.backend, choice.dtype) == (c["backend"], c["dtype"])
        wrong += not ok
        print(f"auto for {stage}: {choice.backend} {choice.dtype} ({choice.why}) — "
              f"{'the fastest row' if ok else 'NOT the fastest row'}")
    return 1 if wrong else 0


STAGE = Stage("measure-engines", "every backend x dtype per stage on this machine; records the fastest, which "
              "backend/dtype auto read", run=measure_engines, config=EngineSpeedConfig,
              flags=(Flag("out"), Flag("record", const=False, name="--no-record", help="same as --set record=false")))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("measure-engines"))
