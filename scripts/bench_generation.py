"""Decoding throughput of the embedded SmolLM2 on CPU: batch size 1 vs wider batches, side by side.

    .venv/bin/python scripts/bench_generation.py --batch-sizes 1 4 8 --new-tokens 48

Why: on this class of machine, greedy decoding of a 135M model is bound by memory bandwidth (each
step streams every weight), so a batch of 8 costs little more per step than a batch of 1. The demo
and the reader size their batches from this measurement. Prints tokens/s per batch size and the
ratio to batch size 1; every run generates exactly ``new_tokens`` per sequence (min_new_tokens), and
every sequence of every batch is the same demo document's prompt, so only the batch width changes.

Then the seeded top-p sampler of the transformers path (temperature 0.1, top_p 0.1: the reader's decoding) on the
model's own next-token logits at the widest batch, side by side: the full sort of the vocabulary it used to do every
step against today's nucleus from a top-64 prefix (``memreader.core.generation.sampling``), ms per step and ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

from memreader.core.corpus import read_corpus
from memreader.core.generation.sampling import SeededSampler
from memreader.core.language import detect_language
from memreader.core.prompts import render
from memreader.core.registry import SMOLLM2
from memreader.core.runtime import load_causal_lm, runtime
from memreader.demo import DEMO_DATA


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    parser.add_argument("--doc", type=int, default=0, help="index of the demo document used as the prompt")
    parser.add_argument("--model", default=SMOLLM2, help="registry name or model folder")
    args = parser.parse_args()
    rt = runtime("cpu", "float32", args.threads)
    model, tok = load_causal_lm(args.model, rt=rt)
    docs = read_corpus(DEMO_DATA / "corpus.jsonl")
    prompts = [tok.apply_chat_template(render("memreader", detect_language(d.text), document=d.text)[0],
                                       add_generation_prompt=True, tokenize=False) for d in docs]
    tok.padding_side = "left"
    rows = []
    for bs in args.batch_sizes:
        batch = [prompts[args.doc]] * bs
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                           pad_token_id=tok.pad_token_id)
        dt = time.perf_counter() - t0
        rows.append((bs, enc["input_ids"].shape[1], dt, bs * args.new_tokens / dt))
    base = rows[0][3]
    print(f"{args.model} fp32, {rt.threads} threads, {args.new_tokens} new tokens per sequence, "
          f"prompt = demo document {docs[args.doc].doc_id}")
    print(f"{'batch':>5} {'prompt_len':>10} {'seconds':>8} {'tok/s':>8} {'x batch1':>8}")
    for bs, plen, dt, tps in rows:
        print(f"{bs:>5} {plen:>10} {dt:>8.1f} {tps:>8.1f} {tps / base:>8.2f}")
    with torch.inference_mode():
        logits = model(**enc).logits[:, -1, :].float()  # the widest batch's next-token logits
    steps = 20
    times = {}
    for name, sampler in (("full sort", FullSortSampler), ("nucleus prefix", SeededSampler)):
        s = sampler(list(range(logits.shape[0])), temperature=0.1, top_p=0.1)
        s(None, logits)  # generators made
        t0 = time.perf_counter()
        for _ in range(steps):
            s(None, logits)
        times[name] = (time.perf_counter() - t0) / steps * 1000
    print(f"top-p sampler, {logits.shape[0]} rows x {logits.shape[1]} vocabulary, temperature 0.1, top_p 0.1: full "
          f"sort {times['full sort']:.2f} ms/step, nucleus prefix {times['nucleus prefix']:.2f} ms/step "
          f"(x{times['full sort'] / times['nucleus prefix']:.1f} faster)")


class FullSortSampler(SeededSampler):
    """The sampler before the nucleus prefix (the reference of the comparison): sorts every row's whole vocabulary."""

    def __call__(self, input_ids, scores):  # noqa: ANN001
        if not self.generators:
            self._make_generators(scores.device)
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        out = torch.full_like(scores, float("-inf"))
        for r, g in enumerate(self.generators):
            sorted_p, order = torch.sort(probs[r], descending=True)
            keep = (torch.cumsum(sorted_p, 0) - sorted_p) < self.top_p
            out[r, order[torch.multinomial(torch.where(keep, sorted_p, torch.zeros_like(sorted_p)), 1, generator=g)]] = 0
        return out


if __name__ == "__main__":
    main()
