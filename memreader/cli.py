"""The ``memreader`` command: one subcommand per job, each a thin wrapper over a stage module.

    memreader demo                       # whole pipeline on the embedded models
    memreader gen   --config configs/data_gen/smollm2_local.yaml
    memreader assess --input artifacts/runs/demo/read/memories.jsonl
    memreader train --config configs/training/smollm2_135m_lora_cpu_smoke.yaml
    memreader merge --adapter artifacts/runs/demo/train
    memreader read  --config configs/inference/smollm2_cpu.yaml
    memreader read-dist --config configs/inference/smollm2_ray_local.yaml
    memreader serve --model smollm2-135m-instruct --port 8000
    memreader index --config configs/retrieval/three_layer_minilm.yaml
    memreader ask   --config configs/retrieval/three_layer_minilm.yaml "question"
    memreader eval  --config configs/eval/multifieldqa_zh.yaml
    memreader report eval-multifieldqa-zh
    memreader score --pred preds.jsonl --ref refs.jsonl --profile mom

Stage modules are imported only for the chosen subcommand, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from memreader.errors import MemReaderError, RunFailed

COMMANDS: dict[str, tuple[str, str]] = {
    "gen": ("data_gen.pipeline", "teacher-side memory generation → memories + SFT data"),
    "assess": ("data_gen.assess", "clarity/completeness of any memories file (evaluator LM), written beside it"),
    "train": ("training.sft", "LoRA fine-tuning with TRL SFTTrainer"),
    "merge": ("training.merge", "merge a LoRA adapter into its base model"),
    "read": ("inference.reader", "MemReader batch reading of a corpus (resumable)"),
    "read-dist": ("inference.distributed", "read a corpus in shards on several GPUs or a Ray cluster, merged into one "
                  "memories file (resumable)"),
    "serve": ("inference.server", "OpenAI-compatible HTTP server over a local model (+ adapter)"),
    "index": ("retrieval.cli", "index memories into Milvus (outline / core / chunk layers)"),
    "ask": ("retrieval.cli", "retrieve chunks for a question, with provenance"),
    "chat": ("retrieval.chat", "terminal chat answered from momentary contexts rebuilt from the stored turns"),
    "eval": ("eval.qa", "RAG QA over memories vs chunking baselines, BLEU/ROUGE-L/METEOR"),
    "report": ("eval.report", "Markdown report with plots of an evaluation run (memreader report RUN)"),
    "score": ("eval.score", "score prediction/reference JSONL files with BLEU/ROUGE-L/METEOR"),
    "demo": ("memreader.demo", "scripts/runcpu.sh: every stage on the embedded models and the demo corpus, checked"),
}


def _top_parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="memreader",
        description="Document memories with small language models: generate, train, read, index, ask, evaluate.",
        epilog=f"commands:\n{lines}\n\nrun 'memreader <command> --help' for a command's options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``memreader <command> ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    top.add_argument("command", choices=sorted(COMMANDS), help=argparse.SUPPRESS)
    top.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    verbose = "-v" in argv or "--verbose" in argv
    argv = [a for a in argv if a not in ("-v", "--verbose")]
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}; choose from {', '.join(COMMANDS)}")
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _quiet_libraries(verbose)  # before the stage imports gRPC / Milvus / faiss
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(
        prog=f"memreader {name}", description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # A module serving several commands (retrieval.cli) maps each to its (add_arguments, run) pair.
    pair = getattr(module, "COMMANDS", {}).get(name)
    adder, runner = pair if pair else (module.add_arguments, module.run)
    adder(parser)
    config_class = getattr(module, "CONFIG_CLASS", None)
    if config_class is not None:
        from memreader.config import describe_config

        parser.epilog = describe_config(config_class)
    args = parser.parse_args(rest)
    try:
        return int(runner(args) or 0)
    except Exception as exc:
        if verbose or not _is_user_error(exc):
            raise
        # Our own exception types carry a message that names the problem and the fix: no traceback.
        print(f"memreader {name}: error: {exc}\n(run with -v for the traceback)", file=sys.stderr)
        return 1 if isinstance(exc, RunFailed) else 2


_OWN_PACKAGES = ("memreader", "data_gen", "training", "inference", "retrieval", "eval")


def _is_user_error(exc: BaseException) -> bool:
    """Errors raised on purpose by this project (its own exception classes), or a missing file."""
    return (isinstance(exc, (MemReaderError, FileNotFoundError))
            or type(exc).__module__.split(".")[0] in _OWN_PACKAGES)


_CHATTY = ("httpx", "httpcore", "openai", "urllib3", "grpc", "pymilvus", "milvus_lite", "faiss", "faiss.loader",
           "sentence_transformers", "datasets", "jieba")


def _quiet_libraries(verbose: bool) -> None:
    """Library chatter (every HTTP request, gRPC and Milvus start-up lines, faiss probing for optional
    builds) stays at WARNING unless ``-v``."""
    if verbose:
        return
    import os

    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    # jieba (Milvus Lite's Chinese BM25 analyzer) sets its logger back to DEBUG on import and logs its
    # dictionary loading through its own handler; a filter on the logger survives that reset.
    logging.getLogger("jieba").addFilter(lambda record: record.levelno >= logging.WARNING)
    # gRPC's C core logs transport events (e.g. a "too_many_pings" GOAWAY after an idle spell) at ERROR
    # and INFO straight to stderr; ERROR would still print them, so NONE. It is read once, when grpc is
    # imported, so it must be set before any stage imports pymilvus. Real failures still raise in pymilvus.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


if __name__ == "__main__":
    raise SystemExit(main())
