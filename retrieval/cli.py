"""``memreader index`` and ``memreader ask``: thin wrappers over :mod:`memreader.retrieval.search`.

    memreader index --config configs/retrieval/three_layer_minilm.yaml --set run=demo
    memreader ask   --config configs/retrieval/three_layer_minilm.yaml --set run=demo "How many compost bays?"
    memreader ask   --config configs/retrieval/three_layer_minilm.yaml --set run=demo --pipeline meve "question"
    memreader ask   --config ... --pipeline meve --html meve.html "question"   (also an offline HTML audit page)
    memreader ask   --config ... --pipeline meve --save meve.json "question"   (also the result and audit as JSON)
    python -m memreader.retrieval.cli ask --config ... "question"        (the same, without the memreader command)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memreader.core.paths import write_json
from memreader.core.stage import Flag, Stage
from memreader.retrieval.audit_page import write_audit_page
from memreader.retrieval.meve import MeVeResult
from memreader.retrieval.meve_audit import format_audit
from memreader.retrieval.search import PIPELINES, RetrievalConfig, Searcher, format_hits, run_index


def _ask_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print hits as JSON lines instead of text (meve: the "
                        "result with its audit record as one JSON object)")
    parser.add_argument("--html", metavar="FILE", help="also write the retrieval as one offline HTML page: MeVe's "
                        "phases (every candidate, kept / dropped and why, the budget) or the layers that found each "
                        "hit, and each hit inside its document")
    parser.add_argument("--save", metavar="FILE", help="also write the result as one JSON object to FILE (meve: with "
                        "its audit record), whatever stdout shows")
    parser.add_argument("question", help="the question to retrieve chunks for")


def _index(cfg: RetrievalConfig) -> int:
    """Build or update the index and print its one-line summary (and how far BM25 statistics drifted)."""
    summary = run_index(cfg)
    print(summary.line())
    if summary.bm25_drift_note():
        print(summary.bm25_drift_note())
    return 0


def _ask(cfg: RetrievalConfig, args: argparse.Namespace) -> int:
    """Retrieve and print chunks with their provenance (or MeVe's context and audit)."""
    with Searcher(cfg) as searcher:
        result = searcher.meve(args.question) if cfg.pipeline == "meve" else searcher.ask(args.question)
        if args.html:
            page = write_audit_page(searcher.index, args.question, result, args.html, cfg.mode)
            print(f"ask: audit page -> {page}", file=sys.stderr)
    if args.save:
        write_json(Path(args.save), result.to_dict() if isinstance(result, MeVeResult) else
                   {"question": args.question, "hits": [hit.to_dict() for hit in result]})
        print(f"ask: result -> {args.save}", file=sys.stderr)
    if isinstance(result, MeVeResult):
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2) if args.json else format_audit(result))
        return 0
    if args.json:
        for hit in result:
            print(json.dumps(hit.to_dict(), ensure_ascii=False))
    else:
        print(format_hits(result))
    return 0


STAGES = (
    Stage("index", "index memories into Milvus (outline / core / chunk layers)", run=_index, config=RetrievalConfig,
          example_dir="configs/retrieval/"),
    Stage("ask", "retrieve chunks for a question, with provenance", run=_ask, config=RetrievalConfig,
          example_dir="configs/retrieval/", arguments=_ask_arguments, needs_args=True,
          flags=(Flag("pipeline", help=f"{' or '.join(PIPELINES)}: layers (search + RRF, the default) or meve (five "
                      "verified phases, packed under t_max tokens); the same as --set pipeline=..."),)),
)

if __name__ == "__main__":  # python -m memreader.retrieval.cli {index,ask} ...
    from memreader.cli import main

    if sys.argv[1:2] not in (["index"], ["ask"]):
        print("usage: python -m memreader.retrieval.cli {index,ask} [--config FILE] [--set KEY=VALUE] [question]", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1:]))
