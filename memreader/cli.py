"""The ``memreader`` command: one subcommand per job, each a thin wrapper over a stage module (``COMMANDS``).

    memreader --help                     # every command with its one-line help
    memreader demo                       # whole pipeline on the embedded models
    memreader eval  --config configs/eval/multifieldqa_zh.yaml

Each subcommand is a :class:`memreader.core.stage.Stage` exported by its module, imported only when chosen; its
module docstring is the command's ``--help``. This module and :mod:`memreader.demo` are the top layer.
Details: docs/ARCHITECTURE.md (One way to define a stage), docs/USAGE.md (every command).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from memreader.core.engines import VERBOSE_ENV
from memreader.core.errors import MemReaderError, RunFailed
from memreader.core.stage import Stage

COMMANDS: dict[str, str] = {
    "ingest": "memreader.ingest.ingest",
    "gen": "memreader.data_gen.pipeline",
    "assess": "memreader.data_gen.assess",
    "structure-data": "memreader.data_gen.structure_data",
    "train": "memreader.training.sft",
    "merge": "memreader.training.merge",
    "read": "memreader.inference.reader",
    "read-dist": "memreader.inference.distributed",
    "serve": "memreader.inference.server",
    "index": "memreader.retrieval.cli",
    "ask": "memreader.retrieval.cli",
    "chat": "memreader.retrieval.chat",
    "eval": "memreader.eval.qa",
    "report": "memreader.eval.report",
    "score": "memreader.eval.score_cli",
    "checkpoint": "memreader.eval.checkpoint",
    "calibrate-meve": "memreader.eval.meve_calibrate",
    "train-verifier": "memreader.eval.cross_encoder_training",
    "measure-engines": "memreader.eval.engine_speed",
    "setup-wordnet": "memreader.eval.wordnet",
    "view": "memreader.viewer.page",
    "demo": "memreader.demo",
}
"""Subcommand → the module whose ``STAGE`` (or ``STAGES``) describes it (:class:`memreader.core.stage.Stage`)."""


def stage(name: str) -> Stage:
    """The :class:`~memreader.core.stage.Stage` of a subcommand (imports its module)."""
    module = importlib.import_module(COMMANDS[name])
    for candidate in (*getattr(module, "STAGES", ()), *([module.STAGE] if hasattr(module, "STAGE") else [])):
        if candidate.name == name:
            return candidate
    raise LookupError(f"{COMMANDS[name]} defines no stage named {name!r}")


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``memreader <command> ...`` (and ``python -m <stage module> ...``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = "\n".join(f"  {name:<15} {stage(name).help}" for name in COMMANDS)
        argparse.ArgumentParser(
            prog="memreader",
            description="Document memories with small language models: generate, train, read, index, ask, evaluate.",
            epilog=f"commands:\n{lines}\n\nrun 'memreader <command> --help' for a command's options",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        ).print_help()
        return 0
    verbose = "-v" in argv or "--verbose" in argv
    argv = [a for a in argv if a not in ("-v", "--verbose")]
    if verbose:  # the engines' own logs too (core.engines.engine_logging), in this process and its children
        os.environ[VERBOSE_ENV] = "1"
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"memreader: error: unknown command {name!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _quiet_libraries(verbose)  # before the stage imports gRPC / Milvus / faiss
    chosen = stage(name)
    args = chosen.parser(importlib.import_module(COMMANDS[name]).__doc__).parse_args(rest)
    try:
        return chosen(args)
    except Exception as exc:
        # Errors raised on purpose for the user (MemReaderError and its subclasses) name the problem and the fix: no
        # traceback. Anything else, a plain FileNotFoundError or KeyError from the project's own code too, is a bug
        # or an unforeseen case and keeps its traceback.
        if verbose or not isinstance(exc, MemReaderError):
            raise
        print(f"memreader {name}: error: {exc}\n(run with -v for the traceback)", file=sys.stderr)
        return 1 if isinstance(exc, RunFailed) else 2


def module_main(name: str) -> int:
    """``python -m <stage module> ARGS`` = ``memreader <name> ARGS`` (the stage modules' ``__main__`` blocks)."""
    return main([name, *sys.argv[1:]])


_CHATTY = ("httpx", "httpcore", "openai", "urllib3", "grpc", "milvus_lite", "faiss", "faiss.loader",
           "sentence_transformers", "datasets", "jieba")


def _quiet_libraries(verbose: bool) -> None:
    """Library chatter (every HTTP request, gRPC and Milvus start-up lines, faiss probing for optional
    builds, model-loading bars) stays at WARNING unless ``-v``; the engines' logs: core.engines.engine_logging."""
    if verbose:
        return
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    # pymilvus logs every failed call at ERROR with its traceback, then raises it: the store turns it into one
    # message naming the server and the fix (a lost server, a refused token), or the traceback follows anyway
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)
    # jieba (Milvus Lite's Chinese BM25 analyzer) sets its logger back to DEBUG on import and logs its
    # dictionary loading through its own handler; a filter on the logger survives that reset.
    logging.getLogger("jieba").addFilter(lambda record: record.levelno >= logging.WARNING)
    # gRPC's C core logs transport events (e.g. a "too_many_pings" GOAWAY after an idle spell) at ERROR
    # and INFO straight to stderr; ERROR would still print them, so NONE. It is read once, when grpc is
    # imported, so it must be set before any stage imports pymilvus. Real failures still raise in pymilvus.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    # transformers draws a "Loading weights" bar for every model it loads (through huggingface_hub's switch, read when
    # transformers is imported): a run's own bars are its stages'
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


if __name__ == "__main__":
    raise SystemExit(main())
