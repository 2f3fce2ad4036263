"""What MoM's selection buys: the RRF winner against a random candidate, on CRUD news with the embedded teacher.

    .venv/bin/python scripts/bench_selection.py                     # 50 CRUD documents, N = 4
    .venv/bin/python scripts/bench_selection.py --docs 10 --candidates 3

Runs the real `memreader gen` (SmolLM2-135M teacher, guided, the same model as evaluator, clarity
variant `ppl`, no reverse CoM: it does not change the selection) on the first ``--docs`` CRUD
documents, then reads ``candidates.jsonl``: per document with at least two scored candidates, the
winner's clarity and completeness against the mean over its candidates (the expected value of a
random pick), with the spread over documents. The run folder is kept, so a rerun is served from
the teacher and score caches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CRUD = ROOT.parent / "shared" / "datasets" / "crud_event_summary.jsonl"


def write_corpus(path: Path, n: int, crud: Path = CRUD) -> None:
    if not crud.is_file():
        raise SystemExit(f"{crud} is missing: put shared/ beside the checkout, or name the file with --data")
    with crud.open(encoding="utf-8") as src, path.open("w", encoding="utf-8") as out:
        for i, line in enumerate(src):
            if i >= n:
                break
            rec = json.loads(line)
            out.write(json.dumps({"id": f"crud-{rec['ID']}", "text": rec["text"]}, ensure_ascii=False) + "\n")


def spread(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4f} ± {statistics.pstdev(values):.4f}" if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=50)
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--home", default="", help="MEMREADER_HOME (default: a folder under /tmp, kept)")
    ap.add_argument("--data", type=Path, default=CRUD, help="the CRUD event-summary JSONL (default: %(default)s)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="teacher and evaluator (registry name or folder)")
    ap.add_argument("--teacher", default="local", help="gen's teacher backend: local (transformers), vllm or auto")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    os.environ["MEMREADER_HOME"] = args.home or os.environ.get("MEMREADER_HOME") or tempfile.mkdtemp(prefix="sel_")
    home = Path(os.environ["MEMREADER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    corpus = home / f"crud{args.docs}.jsonl"
    write_corpus(corpus, args.docs, args.data)

    from memreader.data_gen.pipeline import GenConfig, generate

    cfg = GenConfig(input=str(corpus), run=f"selection-n{args.candidates}", num_candidates=args.candidates,
                    teacher=args.teacher, model=args.model, evaluator=args.model,
                    max_new_tokens=args.max_new_tokens, outline_max_new_tokens=96, batch_size=args.batch_size,
                    reverse_com=False, val_fraction=0, on_unusable="skip")
    t0 = time.perf_counter()
    manifest = generate(cfg)
    seconds = time.perf_counter() - t0
    rows = [json.loads(x) for x in open(manifest["files"]["candidates"], encoding="utf-8")]
    by_doc: dict[str, list[dict]] = {}
    for r in rows:
        if r["clarity"] is not None:
            by_doc.setdefault(r["unit_id"], []).append(r)
    out = {"winner": {"clarity": [], "completeness": []}, "random": {"clarity": [], "completeness": []},
           "gain": {"clarity": [], "completeness": []}}
    for cands in by_doc.values():
        if len(cands) < 2:
            continue
        win = next(r for r in cands if r["selected"])
        for m in ("clarity", "completeness"):
            mean = statistics.fmean(r[m] for r in cands)
            out["winner"][m].append(win[m])
            out["random"][m].append(mean)
            out["gain"][m].append(win[m] - mean)
    n = len(out["gain"]["clarity"])
    print(f"\nselection on {args.docs} CRUD documents, N={args.candidates}, teacher and evaluator "
          f"{cfg.model} (clarity={cfg.clarity_variant}), guided={cfg.guided}: {n} documents with >= 2 scored "
          f"candidates, {len(rows)} usable candidates, gen {seconds:.0f} s")
    print(f"{'':<14}{'clarity (mean ± sd)':>24}{'completeness (mean ± sd)':>28}")
    for k in ("winner", "random", "gain"):
        label = {"winner": "RRF winner", "random": "random pick", "gain": "winner - random"}[k]
        print(f"{label:<14}{spread(out[k]['clarity']):>24}{spread(out[k]['completeness']):>28}")
    summary = {"bench": "selection", "docs": args.docs, "candidates": args.candidates, "scored_docs": n,
               "usable_candidates": len(rows), "seconds": round(seconds, 1),
               **{f"{k}_{m}": round(statistics.fmean(v), 6) for k, d in out.items() for m, v in d.items() if v},
               **{f"{k}_{m}_sd": round(statistics.pstdev(v), 6) for k, d in out.items() for m, v in d.items() if v},
               "manifest": manifest["files"]["candidates"]}
    print(json.dumps(summary))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
