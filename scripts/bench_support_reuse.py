"""Answers plus informational support on vLLM: the two passes apart (each prompt prefilled twice) against
:func:`memreader.eval.answering.answer_and_support`'s order (support first, in groups that fit the prefix cache, so the
answer requests read the prompts' KV blocks the scoring requests wrote).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_support_reuse.py [--questions 16] [--rounds 2]

Prompts are MultiFieldQA-zh questions (``../shared/datasets/longbench_multifieldqa_zh.jsonl``) over the 8
pieces of 178 characters of their context that share the most characters with the question (the eval's
chunk size and top_k, so about the eval's prompt length). The answerer is the eval's: the embedded SmolLM2 on
vLLM bf16, greedy, 64 new tokens. Each round runs both orders from an empty prefix cache, side by side; prints
the wall time of each pass, the ratio, how many replies are equal and the largest support difference.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path

from memreader.core.generation import GenerationParams, make_chat
from memreader.eval.answering import answer_and_support, answer_messages
from memreader.eval.suites import load_eval_set
from memreader.eval.support import support_for_answers

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "longbench_multifieldqa_zh.jsonl"
PIECE, TOP_K = 178, 8


def best_pieces(question: str, context: str) -> list[str]:
    """The TOP_K pieces of PIECE characters sharing the most characters with the question, best first."""
    pieces = [context[i: i + PIECE] for i in range(0, len(context), PIECE)]
    wanted = Counter(question)
    return sorted(pieces, key=lambda p: -sum(min(c, wanted[ch]) for ch, c in Counter(p).items()))[:TOP_K]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    eset = load_eval_set("multifieldqa_zh", args.data, limit=args.questions)
    questions = eset.questions
    contexts = [best_pieces(q.question, eset.documents[eset.question_docs[q.id][0]]) for q in questions]
    prompts = [answer_messages(q.question, c) for q, c in zip(questions, contexts, strict=True)]
    chat = make_chat("vllm", model="smollm2-135m-instruct", dtype="bfloat16")
    params = GenerationParams(temperature=0.0, top_p=1.0, max_new_tokens=64)
    chat.generate_many([[{"role": "user", "content": "你好"}]], params)  # warm-up

    def support(idx: list[int]) -> list[float | None]:
        scores = support_for_answers(chat, [questions[i].question for i in idx], [contexts[i] for i in idx],
                                     [questions[i].answers[0] for i in idx])
        return [s.nll for s in scores]

    tokens = [chat.prompt_tokens(p) for p in prompts]
    print(f"{len(prompts)} prompts, {statistics.mean(tokens):.0f} tokens on average (max {max(tokens)}); prefix cache "
          f"{chat.prefix_cache_tokens()} tokens")
    walls: dict[bool, list[float]] = {False: [], True: []}
    last = {}
    for r in range(args.rounds):
        for reuse in (False, True):
            chat.llm.reset_prefix_cache()
            t0 = time.perf_counter()
            done = answer_and_support(chat, prompts, params, support, reuse_prefix=reuse)
            walls[reuse].append(time.perf_counter() - t0)
            last[reuse] = done
            print(f"round {r + 1} {'support first' if reuse else 'apart        '}: {walls[reuse][-1]:6.1f} s "
                  f"(answers {done.generate_s:6.1f} s, support {done.support_s:6.1f} s, {len(done.groups)} group(s))")
    apart, reused = statistics.median(walls[False]), statistics.median(walls[True])
    same = sum(str(a) == str(b) for a, b in zip(last[False].replies, last[True].replies, strict=True))
    diff = max(abs(a - b) for a, b in zip(last[False].support, last[True].support, strict=True)
               if a is not None and b is not None)
    print(f"median wall: apart {apart:.1f} s, support first {reused:.1f} s: x{apart / reused:.2f} "
          f"({100 * (1 - reused / apart):.0f}% less); replies equal {same}/{len(prompts)}; "
          f"largest support difference {diff:.4f} nats")


if __name__ == "__main__":
    main()
