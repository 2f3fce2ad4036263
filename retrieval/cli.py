"""``memreader index`` and ``memreader ask``: thin wrappers over :mod:`retrieval.search`.

    memreader index --config configs/retrieval/three_layer_minilm.yaml --set run=demo
    memreader ask   --config configs/retrieval/three_layer_minilm.yaml --set run=demo "How many compost bays?"
    memreader ask   --config configs/retrieval/three_layer_minilm.yaml --set run=demo --pipeline meve "question"
    python -m retrieval.cli ask --config ... "question"        (the same, without the memreader command)
"""

from __future__ import annotations

import argparse
import json
import sys

from memreader.config import add_config_arguments, load_config
from retrieval.meve import format_audit
from retrieval.search import PIPELINES, RetrievalConfig, format_hits, run_ask, run_index, run_meve_ask

CONFIG_CLASS = RetrievalConfig


def add_index_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``memreader index``."""
    add_config_arguments(parser, "configs/retrieval/")


def run_index_cli(args: argparse.Namespace) -> int:
    """Build the index and print its one-line summary."""
    summary = run_index(load_config(RetrievalConfig, args.config, args.set))
    print(summary.line())
    return 0


def add_ask_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``memreader ask``."""
    add_config_arguments(parser, "configs/retrieval/")
    parser.add_argument("--pipeline", choices=PIPELINES, help="layers (search + RRF, the default) or meve (five "
                        "verified phases, packed under t_max tokens); the same as --set pipeline=...")
    parser.add_argument("--json", action="store_true", help="print hits as JSON lines instead of text (meve: the "
                        "result with its audit record as one JSON object)")
    parser.add_argument("question", help="the question to retrieve chunks for")


def run_ask_cli(args: argparse.Namespace) -> int:
    """Retrieve and print chunks with their provenance (or MeVe's context and audit)."""
    overrides = list(args.set) + ([f"pipeline={args.pipeline}"] if getattr(args, "pipeline", None) else [])
    cfg = load_config(RetrievalConfig, args.config, overrides)
    if cfg.pipeline == "meve":
        result = run_meve_ask(cfg, args.question)
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2) if args.json else format_audit(result))
        return 0
    hits = run_ask(cfg, args.question)
    if args.json:
        for hit in hits:
            print(json.dumps(hit.to_dict(), ensure_ascii=False))
    else:
        print(format_hits(hits))
    return 0


COMMANDS = {"index": (add_index_arguments, run_index_cli), "ask": (add_ask_arguments, run_ask_cli)}


def main(argv: list[str] | None = None) -> int:
    """``python -m retrieval.cli {index,ask} ...``: the same as ``memreader index|ask``."""
    from memreader.cli import main as memreader_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m retrieval.cli {index,ask} [--config FILE] [--set KEY=VALUE] [question]", file=sys.stderr)
        return 2
    return memreader_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
