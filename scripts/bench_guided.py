"""Guided vs unguided memory generation with the embedded SmolLM2-135M, side by side in one run.

    .venv/bin/python scripts/bench_guided.py                 # 8 demo docs + first 50 CRUD docs
    .venv/bin/python scripts/bench_guided.py --crud 10 --speed-tokens 64
    .venv/bin/python scripts/bench_guided.py --demo-docs 1 --crud 0 --max-new-tokens 256 --speed-tokens 4 \\
        --skip-unguided                                      # one document: a smoke run

Prints, for the same model, prompts (the MemReader prompt, base model) and decoding (paper:
temperature 0.1, top_p 0.1, repetition_penalty 1.05):
1. the usable-memory rate, guided vs unguided: a memory is usable when the reply finished (not cut
   off), parses, aligns with coverage_exact 1.0, and has >= 2 scenarios whenever the document's
   boundary graph allows 2;
2. time per generated token (per row-step of the batch), guided / unguided, same rows and budget,
   alternating the modes twice; and guided against plain ``generate`` without any processor;
3. grammar build + llguidance compile time for 20,000-character documents (zh and en);
4. the distribution of chunk lengths and scenarios per document for the guided memories.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from memreader.core.assemble import memory_from_output
from memreader.core.generation import GenerationParams, LocalChat
from memreader.core.generation.guided import compile_matcher, ll_tokenizer
from memreader.core.language import detect_language
from memreader.core.memory_grammar import BoundaryGraph, GrammarSettings, memory_grammar
from memreader.core.parser import ParseError
from memreader.core.prompts import render
from memreader.core.registry import SMOLLM2

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "memreader" / "demo_data" / "corpus.jsonl"
CRUD = ROOT.parent / "shared" / "datasets" / "crud_event_summary.jsonl"


def demo_docs() -> list[tuple[str, str, str]]:
    """(``demo``, id, text) for every document of the bundled demo corpus."""
    return [("demo", d["id"], d["text"]) for d in map(json.loads, DEMO.read_text(encoding="utf-8").splitlines())]


def load_docs(n_demo: int, n_crud: int, crud: Path = CRUD) -> list[tuple[str, str, str]]:
    """(set, id, text) for the first ``n_demo`` demo documents and the first ``n_crud`` CRUD news texts."""
    docs = demo_docs()[:n_demo]
    if n_crud:
        if not crud.is_file():
            raise SystemExit(f"{crud} is missing: run with --crud 0, or put shared/ beside the checkout")
        with crud.open(encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i >= n_crud:
                    break
                row = json.loads(line)
                docs.append(("crud", str(row["ID"]), row["text"]))
    return docs


def usable(doc_id: str, text: str, reply, graph: BoundaryGraph) -> tuple[bool, object]:
    """(usable?, memory or reason)."""
    if reply.truncated:
        return False, "cut off"
    try:
        mem = memory_from_output(doc_id, text, reply, {}, "raise")
    except ParseError:
        return False, "no chunk"
    need = 1 if graph.single_chunk else 2
    ok = mem.meta["alignment"]["coverage_exact"] == 1.0 and len(mem.scenarios) >= need
    return ok, mem


def quantiles(values: list[float]) -> str:
    if not values:
        return "none"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return (f"n={len(values)} min={min(values):.0f} p10={q[0]:.0f} median={statistics.median(values):.0f} "
            f"p90={q[8]:.0f} max={max(values):.0f} mean={statistics.mean(values):.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo-docs", type=int, default=8, help="first N of the 8 demo documents")
    ap.add_argument("--crud", type=int, default=50, help="CRUD documents after the demo ones")
    ap.add_argument("--data", type=Path, default=CRUD, help="the CRUD event-summary JSONL (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=640, help="budget per memory (grammar limits sized to it)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--speed-tokens", type=int, default=128, help="tokens per row in the speed comparison")
    ap.add_argument("--skip-unguided", action="store_true", help="usable rate for guided only (faster)")
    ap.add_argument("--model", default=SMOLLM2, help="registry name or model folder")
    args = ap.parse_args()

    settings = GrammarSettings(max_scenarios=6)
    chat = LocalChat(args.model, batch_size=args.batch_size)
    tok = chat.tokenizer()
    ll_tok = ll_tokenizer(tok)

    def count(s: str) -> int:
        return len(tok.encode(s, add_special_tokens=False))

    docs = load_docs(args.demo_docs, args.crud, args.data)
    msgs = [render("memreader", detect_language(t), document=t)[0] for _, _, t in docs]
    graphs = [BoundaryGraph.build(t, settings) for _, _, t in docs]
    plans = [memory_grammar(g, settings, args.max_new_tokens, count) for g in graphs]
    params = GenerationParams(temperature=0.1, top_p=0.1, max_new_tokens=args.max_new_tokens,
                              repetition_penalty=1.05, seed=0)
    print(f"settings: model={args.model} docs={len(docs)} ({args.demo_docs} demo + {args.crud} CRUD) "
          f"max_new_tokens={args.max_new_tokens} batch={args.batch_size} {settings}")

    # 1. usable-memory rate
    modes = ["guided"] + ([] if args.skip_unguided else ["unguided"])
    guided_mems = []
    for mode in modes:
        t0 = time.perf_counter()
        replies = chat.generate_many(msgs, params, progress_desc=mode,
                                     grammars=[p.lark for p in plans] if mode == "guided" else None)
        seconds = time.perf_counter() - t0
        for subset in ("demo", "crud"):
            rows = [i for i, d in enumerate(docs) if d[0] == subset]
            if not rows:
                continue
            results = [usable(docs[i][1], docs[i][2], replies[i], graphs[i]) for i in rows]
            n_ok = sum(ok for ok, _ in results)
            reasons = [r for ok, r in results if not ok]
            why = {k: sum(1 for r in reasons if r == k) for k in ("cut off", "no chunk")}
            why["bad tiling or <2 scenarios"] = len(reasons) - sum(why.values())
            print(f"{mode:<8} {subset}: usable {n_ok}/{len(rows)} = {n_ok / len(rows):.0%}  failures {why}")
            if mode == "guided":
                guided_mems += [r for ok, r in results if ok]
        toks = sum(r.completion_tokens or 0 for r in replies)
        print(f"{mode:<8} all: {toks} tokens in {seconds:.1f} s ({toks / seconds:.1f} tok/s)")

    # 2. time per token, same prompts, fixed length (EOS suppressed so both modes emit the same count)
    speed_params = GenerationParams(temperature=0.1, top_p=0.1, max_new_tokens=args.speed_tokens,
                                    repetition_penalty=1.05, seed=0)
    free = "%llguidance {}\nstart: /(.|\\n)*/\n"  # never closes: rows run the full budget
    demo_rows = [i for i, d in enumerate(docs) if d[0] == "demo"]
    speed_msgs = [msgs[i] for i in demo_rows]
    long_plans = [memory_grammar(graphs[i], settings, 100_000, count).lark for i in demo_rows]
    times: dict[str, list[float]] = {"unguided": [], "guided": []}
    for _ in range(2):
        for mode in ("unguided", "guided"):
            grammars = long_plans if mode == "guided" else [free] * len(speed_msgs)
            t0 = time.perf_counter()
            out = chat.generate_many(speed_msgs, speed_params, progress_desc=f"speed {mode}", grammars=grammars)
            dt = time.perf_counter() - t0
            times[mode].append(dt / (len(out) * max(r.completion_tokens for r in out)))
    per = {m: min(v) for m, v in times.items()}
    print(f"time per generated token (best of 2, {len(speed_msgs)} rows x {args.speed_tokens} tokens): "
          f"unguided {per['unguided'] * 1e3:.2f} ms, guided {per['guided'] * 1e3:.2f} ms, "
          f"ratio {per['guided'] / per['unguided']:.3f}x (target <= 1.10x)")
    print("  note: both modes run through the logits processor; 'unguided' uses an always-open grammar, so the "
          "ratio isolates the cost of the memory grammar. Plain generate without any processor, same rows:")
    t0 = time.perf_counter()
    out = chat.generate_many(speed_msgs, speed_params, progress_desc="speed plain")
    plain = (time.perf_counter() - t0) / (len(out) * max(r.completion_tokens for r in out))
    print(f"  plain {plain * 1e3:.2f} ms per row-step (a row that stopped at EOS still costs its padded steps); "
          f"guided / plain {per['guided'] / plain:.3f}x")

    # 3. grammar build + compile for 20,000-character documents
    demo = demo_docs()  # the whole demo corpus: the long documents do not depend on --demo-docs
    for lang, pool in (("zh", [t for s, _, t in docs if s == "crud"]
                        or [t for _, _, t in demo if detect_language(t) == "zh"][:1]),
                       ("en", [t for _, _, t in demo if detect_language(t) == "en"])):
        text = ""
        while len(text) < 20_000:
            text += "\n\n".join(pool) + "\n\n"
        text = text[:20_000]
        big = GrammarSettings(max_scenarios=64)
        t0 = time.perf_counter()
        graph = BoundaryGraph.build(text, big)
        plan = memory_grammar(graph, big, 100_000, count)
        t1 = time.perf_counter()
        compile_matcher(ll_tok, plan.lark)
        t2 = time.perf_counter()
        edges = sum(len(v) for v in graph.edges.values())
        print(f"grammar 20,000 chars ({lang}): {len(graph.starts)} starts, {edges} edges, {len(plan.lark)} bytes of "
              f"lark; build {t1 - t0:.3f} s + compile {t2 - t1:.3f} s = {t2 - t0:.3f} s (target <= 0.5 s)")

    # 4. distributions over the usable guided memories
    print("scenarios per document (guided): " + quantiles([len(m.scenarios) for m in guided_mems]))
    for lang in ("en", "zh"):
        lengths = [s.end - s.start for m in guided_mems if detect_language(m.document) == lang for s in m.scenarios]
        print(f"chunk length in characters ({lang}): " + quantiles(lengths))


if __name__ == "__main__":
    main()
