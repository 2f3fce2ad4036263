"""``memreader index`` and ``memreader ask``: thin wrappers over :mod:`retrieval.search`.

    memreader index --config configs/retrieval/three_layer_minilm.yaml --set run=demo
    memreader ask   --config configs/retrieval/three_layer_minilm.yaml --set run=demo "How many compost bays?"
    python -m retrieval.cli ask --config ... "question"        (the same, without the memreader command)
"""

from __future__ import annotations

import argparse
import json
import sys

from memreader.config import add_config_arguments, load_config
from retrieval.search import RetrievalConfig, format_hits, run_ask, run_index

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
    parser.add_argument("--json", action="store_true", help="print hits as JSON lines instead of text")
    parser.add_argument("question", help="the question to retrieve chunks for")


def run_ask_cli(args: argparse.Namespace) -> int:
    """Retrieve and print chunks with their provenance."""
    hits = run_ask(load_config(RetrievalConfig, args.config, args.set), args.question)
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
