"""Benchmark of the MoM evaluator scorer (core/scoring.py), four measurements in one run:

1. throughput: the batched scorer vs a naive loop (one forward per (a_i, a_{i+1}) pair, plus the
   context-free forward the ``ppl`` variant needs, and one per (c_i, a_i) pair; full logits,
   log-softmax over the whole sequence, no batching) on the same CRUD documents × candidates, with the
   largest difference between their scores;
2. model FLOP/s of the batched scorer (2 × parameters × tokens/s) as a share of the best dense matmul
   rate measured in the same run (fp32 and bf16 n×n products on the device, n = 2048 on CPU and 8192 on
   CUDA, where 2048 is too small to reach the peak; the faster dtype counts);
3. evaluator sanity: AUC of each clarity variant at telling true boundaries (end of one HotpotQA
   article's paragraph + start of another article's) from false ones (one paragraph cut in half at a
   sentence boundary), the ``ppl`` definitions tried, and how often completeness prefers a chunk's own
   core (the paragraph's first sentence; the chunk is the rest) over another paragraph's;
4. peak memory while scoring one 20,000-character document (and a 5,000-character one) for two slice
   sizes and unsliced (CPU: the process's peak resident set, VmHWM, reset through /proc/self/clear_refs
   after malloc_trim before each run; CUDA: torch.cuda.max_memory_allocated above the memory held before
   the run). Both documents fill batches of ``--memory-batch-tokens``: the peak is set by that budget
   (activations; attention grows with the longest sequence, which max_chunk_tokens caps) and by the
   slice size (logits), not by the document's length.

    .venv/bin/python scripts/bench_scoring.py --quick                 # smoke, ~3 min on 2 CPU cores
    .venv/bin/python scripts/bench_scoring.py --out bench_scoring.json  # ~12 min on 2 CPU cores
    python scripts/bench_scoring.py --device cuda --out bench.json    # GPU, whole documents, ~1 min

On 2 CPU cores the run is long because SmolLM2's tokenizer spends ~1.8 tokens per Chinese character:
80 candidate memories are ~56k tokens for the batched scorer and ~120k for the naive loop, at ~430
tokens/s either way (a CPU is compute-bound: batching does not raise its rate; the batched scorer wins
by computing less). ``--doc-chars`` trades document length for time.

Candidate memories are synthetic stand-ins, built here: each document (CPU default: cut to its first
``--doc-chars`` characters at a sentence end) is cut at sentence ends into chunks of random target
sizes 150-400 characters (a different seed per candidate), and each chunk's first sentence stands in
for its core content. Data comes from ../shared/datasets (CRUD news, HotpotQA paragraphs), read only.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import random
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memreader.core import scoring
from memreader.core.registry import SMOLLM2, resolve_model
from memreader.core.runtime import load_causal_lm, runtime
from memreader.core.schema import DocumentMemory, Scenario
from memreader.core.scoring import EvaluatorScorer, ScorerSettings
from memreader.core.scoring_settings import EVALUATOR_BATCH_TOKENS, VARIANTS

_SENT = re.compile(r".+?(?:[。！？!?；;]+[”\"』」]?|\.(?=\s)|\n+|$)", re.S)


def sentences(text: str) -> list[str]:
    """Sentence pieces that concatenate back to ``text`` exactly."""
    parts = [m.group(0) for m in _SENT.finditer(text) if m.group(0)]
    assert "".join(parts) == text
    return parts


def cut_document(text: str, limit: int) -> str:
    """The first whole sentences of ``text`` up to ``limit`` characters (0 = all of it)."""
    if not limit or len(text) <= limit:
        return text
    out = ""
    for s in sentences(text):
        if out and len(out) + len(s) > limit:
            break
        out += s
    return out


def candidate(doc_id: str, text: str, seed: str) -> DocumentMemory:
    """A stand-in memory: chunks cut at sentence ends at random sizes 150-400 chars, core = first sentence."""
    rng = random.Random(seed)
    scenarios, start, cur, first = [], 0, "", None
    target = rng.randint(150, 400)
    sents = sentences(text)
    for i, s in enumerate(sents):
        cur += s
        first = first if first is not None else s
        if len(cur) >= target or i == len(sents) - 1:
            core = first.strip() or cur.strip()[:40]
            scenarios.append(Scenario(outline=core[:20], core=core, start=start, end=start + len(cur)))
            start, cur, first, target = start + len(cur), "", None, rng.randint(150, 400)
    mem = DocumentMemory(doc_id, text, scenarios, meta={"candidate_seed": seed})
    mem.validate()
    return mem


# -- the naive reference loop ------------------------------------------------------------------


class Naive:
    """The same formulas as memreader.core.scoring, one full forward per sequence, full logits."""

    def __init__(self, model: Any, tok: Any, settings: ScorerSettings) -> None:
        self.model, self.tok, self.s = model, tok, settings
        self.device = next(model.parameters()).device
        self.tokens = 0
        self.forwards = 0
        self.distinct: set[tuple[int, ...]] = set()  # sequences, to count exact duplicates across candidates

    def enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def nll(self, ids: list[int], start: int) -> float:
        with torch.inference_mode():
            logits = self.model(torch.tensor([ids], device=self.device)).logits[0].float()
            logp = torch.log_softmax(logits, -1)
            tgt = torch.tensor(ids[start:], device=self.device)
            out = -logp[start - 1 : len(ids) - 1].gather(1, tgt[:, None]).mean().item()
        self.tokens += len(ids)
        self.forwards += 1
        self.distinct.add(tuple(ids))
        return out

    def score(self, mem: DocumentMemory) -> dict[str, Any]:
        m, bos = self.s.max_chunk_tokens, [self.tok.bos_token_id]
        k = min(self.s.ppl_target_tokens or m, m)
        chunks, cores = mem.chunks, mem.cores
        bounds = []
        for a, b in zip(chunks[:-1], chunks[1:], strict=True):
            tgt = self.enc(b)[:k]
            cond = bos + self.enc(a)[-m:] + self.enc(scoring.CLARITY_SEP) + tgt
            delta = self.nll(cond, len(cond) - len(tgt)) - self.nll(bos + tgt, 1)
            bounds.append(1 / (1 + math.exp(-delta / scoring.PPL_TEMPERATURE)))
        terms = []
        for c, a in zip(cores, chunks, strict=True):
            c_ids, tgt = self.enc(c), self.enc(a)[:m]
            ids = bos + c_ids[:m] + self.enc(scoring.CORE_SEP) + tgt
            terms.append(1 / (math.exp(self.nll(ids, len(ids) - len(tgt))) * math.log(max(len(c_ids), 2))))
        clarity = float(np.mean(bounds)) if bounds else scoring.SINGLE_CHUNK_CLARITY["ppl"]
        return {"clarity": clarity, "completeness": float(np.mean(terms)), "boundaries": bounds, "terms": terms}


# -- helpers -------------------------------------------------------------------------------------


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_rate(device: str, dtype: torch.dtype, n: int, reps: int = 5) -> tuple[float, int]:
    """Best dense matmul rate (FLOP/s) of size×size products, size growing from 512 up to ``n`` while one
    product takes under a second (bf16 on a CPU without bf16 units is too slow for 2048)."""
    size = 512
    while True:
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        torch.matmul(a, b)
        best = 0.0
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            torch.matmul(a, b)
            sync(device)
            best = max(best, 2 * size**3 / (time.perf_counter() - t0))
        if size >= n or 2 * (2 * size) ** 3 / best > 1.0:
            return best, size
        size *= 2


def auc(pos: list[float], neg: list[float]) -> float:
    p, n = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > n).sum() + 0.5 * (p == n).sum()) / (p.size * n.size))


def hotpot_pairs(corpus: dict[str, list[str]], n: int, seed: int) -> tuple[list, list, list]:
    """(true boundary pairs, false boundary pairs, (core, chunk) pairs), disjoint paragraphs, stripped."""
    rng = random.Random(seed)
    titles = [t for t, s in corpus.items() if len(s) >= 4]
    rng.shuffle(titles)

    def join(ss: list[str]) -> str:
        return "".join(ss).strip()

    false = [(join(corpus[t][: len(corpus[t]) // 2]), join(corpus[t][len(corpus[t]) // 2 :])) for t in titles[:n]]
    rest = titles[n : 3 * n]
    true = []
    for i in range(n):
        x, y = corpus[rest[2 * i]], corpus[rest[2 * i + 1]]
        true.append((join(x[len(x) // 2 :]), join(y[: len(y) // 2])))
    comp_titles = titles[3 * n : 4 * n]
    comp = [(corpus[t][0].strip(), join(corpus[t][1:])) for t in comp_titles]
    return true, false, comp


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory(scorer: EvaluatorScorer, mem: DocumentMemory, device: str) -> tuple[float, float, int]:
    """(peak MiB above the memory held before, seconds, tokens) of scoring ``mem`` once with a fresh scorer."""
    gc.collect()
    tokens0 = scorer.engine.tokens_processed
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        scorer.score([mem])
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        base = rss_kib("VmRSS")
        t0 = time.perf_counter()
        scorer.score([mem])
        dt = time.perf_counter() - t0
        peak = (rss_kib("VmHWM") - base) / 1024
    return peak, dt, scorer.engine.tokens_processed - tokens0


def long_document(corpus: dict[str, list[str]], chars: int) -> DocumentMemory:
    """HotpotQA paragraphs in file order, joined by blank lines up to ``chars``: one chunk per paragraph."""
    scenarios, text = [], ""
    for title, sents in corpus.items():
        para = "".join(sents).strip() + "\n\n"
        if len(text) + len(para) > chars:
            para = para[: chars - len(text)]
        if not para.strip():
            break
        scenarios.append(Scenario(title[:20], sents[0].strip(), len(text), len(text) + len(para)))
        text += para
        if len(text) >= chars:
            break
    mem = DocumentMemory(f"hotpot-{chars}", text, scenarios)
    mem.validate()
    return mem


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA; on CPU the faster of fp32 and bf16 by a cached probe) | float32 | bfloat16")
    ap.add_argument("--model", default=SMOLLM2, help="registry name or model folder")
    ap.add_argument("--random-init", action="store_true",
                    help="random weights of the model's architecture (throughput only; the sanity AUCs are skipped)")
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=60, help="true and as many false boundary pairs")
    ap.add_argument("--doc-chars", type=int, default=None,
                    help="cut each CRUD document to its first N characters at a sentence end (0 = whole; "
                         "default 500 on CPU, 0 on CUDA)")
    ap.add_argument("--memory-chars", type=int, default=20000, help="length of the long document of part 4")
    ap.add_argument("--memory-batch-tokens", type=int, default=2048,
                    help="evaluator_batch_tokens in part 4, below both documents' token counts, so that both fill batches")
    ap.add_argument("--max-batch-tokens", type=int, default=EVALUATOR_BATCH_TOKENS)
    ap.add_argument("--slice-tokens", type=int, default=256)
    ap.add_argument("--datasets", default="../shared/datasets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--matmul-n", type=int, default=None,
                    help="largest n of the n x n matmul probe of part 2 (default 2048 on CPU, 8192 on CUDA)")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--out", help="also write the results as JSON here")
    args = ap.parse_args()
    if args.quick:
        args.docs, args.candidates, args.pairs = min(args.docs, 4), min(args.candidates, 2), min(args.pairs, 12)
        args.memory_chars, args.memory_batch_tokens = min(args.memory_chars, 8000), min(args.memory_batch_tokens, 1024)
    t_start = time.perf_counter()
    rt = runtime(args.device, args.dtype)
    device = rt.device
    if args.doc_chars is None:
        args.doc_chars = 0 if device.startswith("cuda") else 500
    data = Path(args.datasets)

    if args.random_init:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        folder = resolve_model(args.model)
        tok = AutoTokenizer.from_pretrained(folder)
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=rt.dtype).to(device).eval()
    else:
        model, tok = load_causal_lm(args.model, rt=rt)
    dtype_name = str(next(model.parameters()).dtype).replace("torch.", "")
    settings = ScorerSettings(evaluator=args.model, evaluator_device=device, evaluator_dtype=dtype_name,
                              evaluator_batch_tokens=args.max_batch_tokens, slice_tokens=args.slice_tokens)
    scorer = EvaluatorScorer(settings, model, tok)
    naive = Naive(model, tok, settings)
    params = sum(p.numel() for p in model.parameters())
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else f"{torch.get_num_threads()} CPU threads"
    print(f"[{time.perf_counter() - t_start:.0f} s] model {args.model}{' (random init)' if args.random_init else ''}: "
          f"{params / 1e6:.1f}M parameters, "
          f"{dtype_name}, {device} ({gpu}); evaluator_batch_tokens={args.max_batch_tokens} "
          f"slice_tokens={args.slice_tokens} max_chunk_tokens={settings.max_chunk_tokens} "
          f"ppl_target_tokens={settings.ppl_target_tokens}")
    results: dict[str, Any] = {"model": args.model, "random_init": args.random_init, "params": params,
                               "device": device, "device_name": gpu, "dtype": dtype_name,
                               "settings": {k: v for k, v in vars(settings).items()}, "args": vars(args)}

    # 1. throughput ----------------------------------------------------------------------------
    docs = []
    with (data / "crud_event_summary.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            text = cut_document(row["text"], args.doc_chars)
            if len(text) >= 300:
                docs.append((row["ID"], text))
            if len(docs) == args.docs:
                break
    mems = [candidate(f"{doc_id}#{c}", text, f"{args.seed}-{doc_id}-{c}")
            for doc_id, text in docs for c in range(args.candidates)]
    n_chunks = [len(m.scenarios) for m in mems]
    print(f"\n[1] at {time.perf_counter() - t_start:.0f} s: {len(docs)} CRUD documents ({np.mean([len(t) for _, t in docs]):.0f} chars on average"
          f"{f', cut to <= {args.doc_chars}' if args.doc_chars else ''}) x {args.candidates} stand-in candidates "
          f"= {len(mems)} memories, {np.mean(n_chunks):.1f} chunks each (sizes 150-400 chars at sentence ends; "
          "core = the chunk's first sentence); variant ppl + completeness")
    scorer.score(mems if device.startswith("cuda") else mems[:2])  # warm-up (on CUDA: every batch shape)
    naive.score(mems[0])
    sync(device)
    tok0, pad0 = scorer.engine.tokens_processed, scorer.engine.padded_tokens
    t0 = time.perf_counter()
    batched = scorer.score(mems)
    sync(device)
    t_batched = time.perf_counter() - t0
    tok_batched = scorer.engine.tokens_processed - tok0
    pad_batched = scorer.engine.padded_tokens - pad0
    naive.tokens, naive.forwards, naive.distinct = 0, 0, set()
    t0 = time.perf_counter()
    ref = [naive.score(m) for m in mems]
    sync(device)
    t_naive = time.perf_counter() - t0
    diffs = []
    rel_terms = []
    for s, r in zip(batched, ref, strict=True):
        diffs += [abs(s.clarity - r["clarity"]), abs(s.completeness - r["completeness"])]
        diffs += [abs(x - y) for x, y in zip(s.boundaries, r["boundaries"], strict=True)]
        diffs += [abs(x - y) for x, y in zip(s.chunk_terms, r["terms"], strict=True)]
        rel_terms += [abs(x - y) / abs(y) for x, y in zip(s.chunk_terms, r["terms"], strict=True)]
    tput = {
        "memories": len(mems), "batched_s": t_batched, "naive_s": t_naive, "speedup": t_naive / t_batched,
        "batched_tokens": tok_batched, "batched_padded_tokens": pad_batched, "naive_tokens": naive.tokens,
        "batched_tok_s": tok_batched / t_batched, "naive_tok_s": naive.tokens / t_naive,
        "batched_mem_s": len(mems) / t_batched, "naive_mem_s": len(mems) / t_naive,
        "max_abs_diff": max(diffs), "max_rel_diff_terms": max(rel_terms),
        "naive_forwards": naive.forwards, "naive_distinct_sequences": len(naive.distinct),
    }
    results["throughput"] = tput
    print(f"    batched: {t_batched:7.1f} s  {tput['batched_tok_s']:8.0f} tok/s  ({tok_batched} tokens through the "
          f"model, {pad_batched} with padding, {scorer.engine.batches} batches in all)")
    print(f"    naive:   {t_naive:7.1f} s  {tput['naive_tok_s']:8.0f} tok/s  ({naive.tokens} tokens in "
          f"{naive.forwards} forwards, {len(naive.distinct)} of them distinct: candidates of one document share "
          "chunks, which the batched scorer computes once)")
    print(f"    speedup {tput['speedup']:.2f}x for the same scores (goal >= 4x); max |diff| of scores "
          f"{tput['max_abs_diff']:.2e} (goal < 1e-4 in fp32), max relative diff of completeness terms "
          f"{tput['max_rel_diff_terms']:.2e}")

    # 2. FLOP/s --------------------------------------------------------------------------------
    rates = {}
    for dt in (torch.float32, torch.bfloat16):
        rate, n = matmul_rate(device, dt, args.matmul_n or (8192 if device.startswith("cuda") else 2048))
        rates[str(dt).replace("torch.", "")] = {"flops": rate, "n": n}
    peak_name = max(rates, key=lambda k: rates[k]["flops"])
    peak = rates[peak_name]["flops"]
    model_flops = 2 * params * tput["batched_tok_s"]
    naive_flops = 2 * params * tput["naive_tok_s"]
    results["flops"] = {"matmul": rates, "peak": peak, "peak_dtype": peak_name, "model_flops": model_flops,
                        "share_of_peak": model_flops / peak, "naive_share_of_peak": naive_flops / peak}
    print(f"\n[2] at {time.perf_counter() - t_start:.0f} s: matmul: " + ", ".join(f"{k} {v['flops'] / 1e9:.1f} GFLOP/s ({v['n']}x{v['n']})" for k, v in rates.items())
          + f"; best {peak_name}")
    print(f"    batched scorer: 2 x {params / 1e6:.1f}M params x {tput['batched_tok_s']:.0f} tok/s = "
          f"{model_flops / 1e9:.1f} GFLOP/s = {100 * model_flops / peak:.0f}% of the matmul peak (goal >= 40%); "
          f"naive loop: {100 * naive_flops / peak:.0f}%")

    # 3. evaluator sanity ----------------------------------------------------------------------
    corpus = json.loads((data / "hotpotqa_100_corpus.json").read_text(encoding="utf-8"))
    if args.random_init:
        print("\n[3] skipped: random weights say nothing about boundaries")
    else:
        true, false, comp = hotpot_pairs(corpus, args.pairs, args.seed)
        t0 = time.perf_counter()
        sanity: dict[str, Any] = {"pairs": [len(true), len(false)], "variants": {}}
        # prob and margin share their prompts; ppl comes from one pass of per-token NLLs over whole targets,
        # from which every "first K tokens" definition (the default's K included) is exact.
        by_variant = scorer.boundary_variants(true + false, ["prob", "margin"])
        sweep_scorer = EvaluatorScorer(ScorerSettings(**{**vars(settings), "ppl_target_tokens": 0}), model, tok)
        nlls = sweep_scorer.boundary_nlls(true + false)
        tried = {}
        for k in sorted({0, 8, 16, 32, 64, settings.ppl_target_tokens}):
            deltas = [float(c[: k or len(c)].mean() - u[: k or len(u)].mean()) for c, u in nlls]
            tried[f"first {k} tokens" if k else "whole target"] = auc(deltas[: len(true)], deltas[len(true) :])
            if k == settings.ppl_target_tokens:
                by_variant["ppl"] = [1 / (1 + math.exp(-d / scoring.PPL_TEMPERATURE)) for d in deltas]
        rel = [float((c.mean() - u.mean()) / u.mean()) for c, u in nlls]
        tried["relative gain, whole target"] = auc(rel[: len(true)], rel[len(true) :])
        for variant in VARIANTS:
            vals = by_variant[variant]
            pos, neg = vals[: len(true)], vals[len(true) :]
            sanity["variants"][variant] = {"auc": auc(pos, neg), "mean_true": float(np.mean(pos)),
                                           "mean_false": float(np.mean(neg))}
        sanity["ppl_definitions_tried"] = tried
        own_other = [(core, chunk) for core, chunk in comp]
        others = [comp[(i + 1) % len(comp)][0] for i in range(len(comp))]
        own_other += [(other, chunk) for other, (_, chunk) in zip(others, comp, strict=True)]
        terms = scorer.completeness_terms(own_other)
        own, other = terms[: len(comp)], terms[len(comp) :]
        sanity["completeness_own_core_preferred"] = float(np.mean([a > b for a, b in zip(own, other, strict=True)]))
        sanity["seconds"] = time.perf_counter() - t0
        results["sanity"] = sanity
        print(f"\n[3] {len(true)} true + {len(false)} false HotpotQA boundaries ({sanity['seconds']:.0f} s)")
        for variant, row in sanity["variants"].items():
            mark = "  <- default" if variant == settings.clarity_variant else ""
            print(f"    {variant:6s} AUC {row['auc']:.3f}  mean b: true {row['mean_true']:.3f} / "
                  f"false {row['mean_false']:.3f}{mark}")
        print("    ppl, definitions tried (AUC of the NLL gain; sigmoid is monotone): "
              + ", ".join(f"{k} {v:.3f}" for k, v in tried.items()))
        print(f"    completeness prefers the chunk's own core over another paragraph's in "
              f"{100 * sanity['completeness_own_core_preferred']:.0f}% of {len(comp)} paragraphs "
              "(core = first sentence, chunk = the rest)")

    # 4. peak memory ---------------------------------------------------------------------------
    long_mem = long_document(corpus, args.memory_chars)
    short_mem = long_document(corpus, args.memory_chars // 4)
    vocab = model.get_output_embeddings().weight.shape[0]
    rows = []
    kind = "CUDA max_memory_allocated" if device.startswith("cuda") else "peak RSS (VmHWM)"
    print(f"\n[4] at {time.perf_counter() - t_start:.0f} s: peak memory ({kind} above the memory held before), "
          f"scoring one HotpotQA-paragraph document (ppl + completeness), evaluator_batch_tokens={args.memory_batch_tokens}")
    peak_memory(EvaluatorScorer(ScorerSettings(**{**vars(settings), "evaluator_batch_tokens": args.memory_batch_tokens}),
                                model, tok), short_mem, device)  # warm-up: one-time allocations stay out of the rows
    for mem, slice_tokens in ((long_mem, 32), (long_mem, 256), (short_mem, 32), (short_mem, 256), (long_mem, 10**9)):
        probe_settings = {**vars(settings), "slice_tokens": slice_tokens, "evaluator_batch_tokens": args.memory_batch_tokens}
        probe = EvaluatorScorer(ScorerSettings(**probe_settings), model, tok)
        mib, dt, ntok = peak_memory(probe, mem, device)
        label = "unsliced" if slice_tokens >= 10**9 else str(slice_tokens)
        logits_mib = min(slice_tokens, args.memory_batch_tokens) * vocab * 4 / 2**20
        rows.append({"doc_chars": len(mem.document), "chunks": len(mem.scenarios), "slice_tokens": label,
                     "peak_mib": mib, "logit_slice_mib": logits_mib, "seconds": dt, "tokens": ntok,
                     "longest_sequence": probe.engine.max_width})
        print(f"    {len(mem.document):6d} chars, {len(mem.scenarios):3d} chunks, {ntok:6d} tokens (longest sequence "
              f"{probe.engine.max_width:4d}), slice {label:>8s}: peak +{mib:7.1f} MiB  (one fp32 logit slice <= "
              f"{logits_mib:7.1f} MiB)  {dt:5.1f} s")
    results["memory"] = {"measure": kind, "rows": rows}
    results["total_seconds"] = time.perf_counter() - t_start

    # summary ----------------------------------------------------------------------------------
    print("\nsummary")
    print(f"  {'speedup batched/naive':34s} {tput['speedup']:8.2f}x   (goal >= 4x)")
    print(f"  {'batched tok/s':34s} {tput['batched_tok_s']:8.0f}")
    print(f"  {'max |score diff|':34s} {tput['max_abs_diff']:8.1e}   (goal < 1e-4 in fp32)")
    print(f"  {'model FLOP/s share of matmul peak':34s} {100 * results['flops']['share_of_peak']:7.0f}%   (goal >= 40%)")
    if "sanity" in results:
        for variant, row in results["sanity"]["variants"].items():
            print(f"  {'AUC ' + variant:34s} {row['auc']:8.3f}" + ("   (goal >= 0.75)" if variant == "ppl" else ""))
        print(f"  {'completeness own-core preferred':34s} {100 * results['sanity']['completeness_own_core_preferred']:7.0f}%")
    for row in rows:
        print(f"  {'peak MiB, ' + str(row['doc_chars']) + ' chars, slice ' + row['slice_tokens']:34s} "
              f"{row['peak_mib']:8.1f}")
    print(f"  {'total run time':34s} {results['total_seconds']:8.0f} s")
    print(json.dumps(results, default=str))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
