"""Every backend x dtype, side by side on the same inputs, on the machine it runs on; records the fastest per stage.

    .venv/bin/python scripts/bench_engines.py                       # demo corpus + 50 CRUD documents
    .venv/bin/python scripts/bench_engines.py --crud 8 --out bench_engines.json   # quicker
    .venv/bin/python scripts/bench_engines.py --no-record            # measure only

Rows: ``transformers`` and ``vllm`` (vLLM's CPU build here, upstream vLLM on a GPU), each in ``float32`` and
``bfloat16``, all on the embedded SmolLM2-135M-Instruct. Per row, in one process, one after another:

1. **start-up**: loading the model (transformers) or starting the engine (vLLM);
2. **guided reading** of the demo corpus plus ``--crud`` CRUD news texts, paper decoding (temperature 0.1),
   512-token memories, batch 8, each document's memory grammar: documents/s and generated tokens/s with the
   start-up excluded and included, and the usable rate (guided memories with at least two scenarios, no
   whole-document fallback, over the documents asked);
3. **scoring**: the evaluator scorer (clarity ``ppl`` + completeness) of the first row's memories, the same memories
   for every row: prompt tokens/s;
4. **answering**: 24 QA prompts (demo questions over retrieved-size contexts), greedy, 32 new tokens: prompt tokens
   per second of the prefill alone (``max_new_tokens=1``) and answers/s with 32 tokens;
5. **support**: the reference answers' NLL under the same prompts (prefill only): prompt tokens/s, and model
   FLOP/s (2 x non-embedding parameters + attention, per token) as a share of the matmul rate of that dtype
   measured at the start of the run (:func:`memreader.core.hardware.matmul_rate`, n = 1024 and 2048);
6. **MeVe verifier**: the LM verifier's P(yes) for each of the 24 questions over its 8 chunks: passages/s;
7. **chat**: 6 of the QA prompts one at a time (as a conversation asks), 32 new tokens: seconds per reply.

vLLM runs with prefix caching off, so every row computes every token (real runs keep it on: support then scores
prompts the answerer has just prefilled, mostly from the cache).

The fastest row per stage (reading: documents/s with start-up included, for this workload; scoring, answering,
support, verifier, chat: their rates) is written to ``$MEMREADER_HOME/engine_choice.json`` for this machine (unless
``--no-record``), where ``backend: auto`` and ``dtype: auto`` read it; the run then resolves ``auto`` for each
stage and prints that it picked the fastest row.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "memreader" / "demo_data" / "corpus.jsonl"
CRUD = ROOT.parent / "shared" / "datasets" / "crud_event_summary.jsonl"
QUESTIONS = ["How many compost bays are there?", "Who meets in the old hall?", "What did the club write last year?",
             "Where does the trip go?", "What is stored behind the tool shed?", "When does the club meet?"]


def corpus(path: Path, n_crud: int) -> Path:
    rows = [json.loads(line) for line in DEMO.read_text(encoding="utf-8").splitlines()]
    with CRUD.open(encoding="utf-8") as f:
        for i, line in zip(range(n_crud), f, strict=False):
            rows.append({"id": f"crud-{i:03d}", "text": json.loads(line)["text"]})
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


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


def model_flops_per_token(config: Any, seq_len: int) -> float:
    """2 x non-embedding parameters of a Llama-shaped decoder, plus causal attention (QK^T and AV) at ``seq_len``."""
    d, layers = config.hidden_size, config.num_hidden_layers
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = d // heads
    inter = config.intermediate_size
    per_layer = d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d + 3 * d * inter
    attention = 2 * 2 * layers * heads * head_dim * seq_len / 2  # causal: half the positions on average
    return 2.0 * per_layer * layers + attention


def make_backend(backend: str, dtype: str) -> tuple[Any, float]:
    """The row's engine, built by the stages' factory (the row's backend and dtype set, device auto)."""
    from memreader.core.engines import make_engine, resolve_engine

    t0 = time.perf_counter()
    # prefix caching off (vLLM): every row computes every prompt token (the QA prompts share chunks, and support
    # scores the prompts just answered, which vLLM's cache would serve; real runs keep it on)
    chat: Any = make_engine(resolve_engine("read", backend, dtype), "smollm2-135m-instruct", batch_size=8,
                            max_model_len=8192, prefix_caching=False)
    if backend == "transformers":
        chat.model()
    return chat, time.perf_counter() - t0


def bench_reading(chat: Any, backend: str, dtype: str, corpus_path: Path, work: Path) -> dict[str, Any]:
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
    tokens = sum(m.meta.get("generation", {}).get("completion_tokens") or 0 for m in memories) + sum(
        (w.get("generation", {}).get("completion_tokens") or 0) for m in memories for w in m.meta.get("windows", []))
    usable = sum(1 for m in memories if m.meta.get("generation", {}).get("guided", True) and len(m.scenarios) >= 2
                 and "fallback" not in m.meta)
    return {"documents": len(docs), "read": summary["read"], "seconds": round(seconds, 1), "tokens": tokens,
            "docs_per_s": len(docs) / seconds, "tok_per_s": tokens / seconds, "usable_rate": usable / len(docs),
            "memories": memories}


def qa_items(memories: list[Any]) -> tuple[list[str], list[list[str]], list[str]]:
    chunks = [c for m in memories for c in m.chunks]
    questions, contexts, answers = [], [], []
    for i in range(24):
        questions.append(QUESTIONS[i % len(QUESTIONS)])
        contexts.append([chunks[(i * 3 + k) % len(chunks)] for k in range(8)])  # 8 retrieved chunks, as eval
        answers.append(chunks[(i * 5) % len(chunks)][:80])
    return questions, contexts, answers


def demo_memories() -> list[Any]:
    """The demo documents cut at paragraphs and sentences into ~300-character chunks (``--stages`` without
    ``read``: the QA contexts come from these instead of the first row's memories)."""
    import re

    from memreader.core.schema import DocumentMemory, Scenario

    out = []
    for line in DEMO.read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        text, cuts, start = doc["text"], [], 0
        for m in re.finditer(r"(?<=[.!?])\s+", text):
            if m.end() - start >= 300:
                cuts.append(m.end())
                start = m.end()
        spans = list(zip([0, *cuts], [*cuts, len(text)], strict=True))
        spans = [(a, b) for a, b in spans if b > a]
        out.append(DocumentMemory(doc["id"], text, [Scenario(f"part {i}", "", a, b) for i, (a, b) in enumerate(spans)]))
    return out


def bench_row(backend: str, dtype: str, corpus_path: Path, work: Path, shared: dict[str, Any],
              rates: dict[str, float], stages: set[str]) -> dict[str, Any]:
    from memreader.eval.answering import answer_messages

    print(f"--- {backend} {dtype}", flush=True)
    chat, startup = make_backend(backend, dtype)
    row: dict[str, Any] = {"backend": backend, "dtype": dtype, "startup_s": round(startup, 1)}
    if "read" in stages:
        reading = bench_reading(chat, backend, dtype, corpus_path, work)
        memories = reading.pop("memories")
        shared.setdefault("memories", memories)  # every row scores and answers over the first row's memories
        reading["docs_per_s_with_startup"] = reading["documents"] / (reading["seconds"] + startup)
        row["reading"] = reading
    else:
        shared.setdefault("memories", demo_memories())
    if "scorer" in stages:
        row["scoring"] = bench_scoring(chat, backend, dtype, shared["memories"])
    questions, contexts, answers = qa_items(shared["memories"])
    prompts = [answer_messages(q, c) for q, c in zip(questions, contexts, strict=True)]
    if "answer" in stages or "support" in stages:
        row.update(bench_answering(chat, dtype, prompts, questions, contexts, answers, rates))
    if "verifier" in stages:
        row["verifier"] = bench_verifier(chat, backend, questions, contexts)
    if "chat" in stages:
        row["chat"] = bench_chat(chat, prompts)
    if backend == "vllm":
        from memreader.core.vllm_engine import shutdown_engines

        shutdown_engines()
    return row


def bench_scoring(chat: Any, backend: str, dtype: str, memories: list[Any]) -> dict[str, Any]:
    """The evaluator scorer (``ppl`` clarity + completeness) over ``memories``: prompt tokens/s."""
    from memreader.core.scoring import EvaluatorScorer, ScorerSettings

    if backend == "vllm":
        scorer = EvaluatorScorer(ScorerSettings(backend="vllm", dtype=dtype), engine=chat.engine)
    else:
        scorer = EvaluatorScorer(ScorerSettings(dtype=dtype), chat.model(), chat.tokenizer())
    before = scorer.engine.tokens_processed
    t0 = time.perf_counter()
    scorer.score(memories, ["ppl"])
    dt = time.perf_counter() - t0
    return {"tokens": scorer.engine.tokens_processed - before, "seconds": round(dt, 2),
            "tok_per_s": (scorer.engine.tokens_processed - before) / dt}


def bench_answering(chat: Any, dtype: str, prompts: list[Any], questions: list[str], contexts: list[list[str]],
                    answers: list[str], rates: dict[str, float]) -> dict[str, Any]:
    """Answering (prefill alone, then 32-token answers) and support of the reference answers."""
    from memreader.core.generation import GenerationParams
    from memreader.eval.support import support_for_answers

    # answering: prefill alone, then 32-token answers
    row: dict[str, Any] = {}
    tok = chat.tokenizer()
    prompt_tokens = [len(tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)
                         ["input_ids"]) for p in prompts]
    t0 = time.perf_counter()
    chat.generate_many(prompts, GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=1))
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    chat.generate_many(prompts, GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=32))
    answer_s = time.perf_counter() - t0
    row["answering"] = {"prompts": len(prompts), "prompt_tokens": sum(prompt_tokens),
                        "prefill_tok_per_s": sum(prompt_tokens) / prefill, "answers_per_s": len(prompts) / answer_s}
    # support (prefill only, scoring the answer tokens)
    t0 = time.perf_counter()
    scores = support_for_answers(chat, questions, contexts, answers)
    dt = time.perf_counter() - t0
    seq_tokens = sum(prompt_tokens) + sum(s.n_tokens for s in scores)
    from transformers import AutoConfig

    from memreader.core.registry import resolve_model

    config = AutoConfig.from_pretrained(resolve_model("smollm2-135m-instruct"))
    mean_len = seq_tokens / len(scores)
    flops = model_flops_per_token(config, int(mean_len)) * seq_tokens / dt
    row["support"] = {"tokens": seq_tokens, "seconds": round(dt, 2), "tok_per_s": seq_tokens / dt,
                      "model_gflops": flops / 1e9, "share_of_matmul": flops / 1e9 / rates[dtype]}
    answer_flops = model_flops_per_token(config, int(sum(prompt_tokens) / len(prompts))) * sum(prompt_tokens) / prefill
    row["answering"]["share_of_matmul"] = answer_flops / 1e9 / rates[dtype]
    return row


def bench_verifier(chat: Any, backend: str, questions: list[str], contexts: list[list[str]]) -> dict[str, Any]:
    """MeVe's LM verifier: P(yes) of every (question, retrieved chunk) pair, 24 questions x 8 chunks."""
    from memreader.retrieval.verifier import LMVerifier

    verifier = LMVerifier(chat.engine if backend == "vllm" else chat.model(), chat.tokenizer(), batch_size=8)
    pairs = sum(len(c) for c in contexts)
    t0 = time.perf_counter()
    for q, c in zip(questions, contexts, strict=True):
        verifier.score(q, c)
    dt = time.perf_counter() - t0
    return {"passages": pairs, "seconds": round(dt, 2), "passages_per_s": pairs / dt}


def bench_chat(chat: Any, prompts: list[Any]) -> dict[str, Any]:
    """The chat: 6 of the QA prompts one at a time (as a conversation asks), 32 new tokens: seconds per reply."""
    from memreader.core.generation import GenerationParams

    t0 = time.perf_counter()
    for p in prompts[:6]:
        chat.generate_many([p], GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=32))
    dt = time.perf_counter() - t0
    return {"replies": 6, "seconds": round(dt, 2), "s_per_reply": dt / 6}



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crud", type=int, default=50, help="CRUD news documents added to the 8 demo documents")
    ap.add_argument("--rows", default="transformers:float32,transformers:bfloat16,vllm:float32,vllm:bfloat16")
    ap.add_argument("--out", default="", help="also write the rows as JSON here")
    ap.add_argument("--no-record", action="store_true", help="do not write engine_choice.json")
    ap.add_argument("--stages", default=",".join(STAGE_KEYS), help="stages to measure (without read, the QA "
                    "contexts are the demo documents cut into ~300-character chunks); only these are recorded")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from memreader.core.engines import machine_key, record_choices, resolve_engine
    from memreader.core.hardware import cpu_model, matmul_rate

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"machine: {machine_key()} ({cpu_model()}), {torch.get_num_threads()} threads, device {device}")
    rates = {d: max(matmul_rate(d, 1024), matmul_rate(d, 2048)) for d in ("float32", "bfloat16")}
    print(f"matmul: fp32 {rates['float32']:.0f} GFLOP/s, bf16 {rates['bfloat16']:.0f} GFLOP/s")
    stages = set(args.stages.split(","))
    unknown = stages - set(STAGE_KEYS)
    if unknown:
        ap.error(f"unknown stages {sorted(unknown)}; choose from {', '.join(STAGE_KEYS)}")
    rows = []
    shared: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus_path = corpus(work / "corpus.jsonl", args.crud)
        for spec in args.rows.split(","):
            backend, dtype = spec.split(":")
            rows.append(bench_row(backend, dtype, corpus_path, work, shared, rates, stages))
            print("row:", json.dumps(rows[-1], default=float), flush=True)  # kept even if a later row fails
    print()
    for r in rows:
        cells = [f"{r['backend']} {r['dtype']}", f"start-up {r['startup_s']:.1f} s"]
        for key, (name, fmt) in COLUMNS.items():
            section, metric = key
            if section in r:
                cells.append(f"{name} {format(r[section][metric], fmt)}")
        print(" | ".join(cells))
    best = {stage: max(rows, key=lambda r, k=key: r[k[0]][k[1]] * k[2])
            for stage, key in STAGE_KEYS.items() if stage in stages and all(key[0] in r for r in rows)}
    choices = {stage: {"backend": r["backend"], "dtype": r["dtype"], "measured": time.strftime("%Y-%m-%d"),
                       "by": "scripts/bench_engines.py"} for stage, r in best.items()}
    for stage, c in choices.items():
        print(f"fastest {stage}: {c['backend']} {c['dtype']}")
    if not args.no_record:
        path = record_choices(choices)
        print(f"recorded → {path}")
        for stage, c in choices.items():
            choice = resolve_engine(stage)
            ok = (choice.backend, choice.dtype) == (c["backend"], c["dtype"])
            print(f"auto for {stage}: {choice.backend} {choice.dtype} ({choice.why}) — "
                  f"{'the fastest row' if ok else 'NOT the fastest row'}")
            if not ok:
                return 1
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine_key(), "matmul_gflops": rates, "rows": rows,
                                              "choices": choices}, indent=2, default=float) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
