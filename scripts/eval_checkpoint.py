"""Save or restore a portable checkpoint of a long ``memreader eval`` run (eval/checkpoint.py).

    .venv/bin/python scripts/eval_checkpoint.py save    --config configs/eval/multifieldqa_zh.yaml \\
        --to results/eval-multifieldqa-zh
    .venv/bin/python scripts/eval_checkpoint.py restore --config configs/eval/multifieldqa_zh.yaml \\
        --from results/eval-multifieldqa-zh

The run folder ($MEMREADER_HOME/runs/<run>/eval) and the model chunkers' shared cache folder are the ones the
evaluation itself uses, resolved from the same config and ``--set`` overrides; restore before resuming the same
``memreader eval`` command, save (and commit) while it runs or after it stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memreader.core.config import load_config
from memreader.core.errors import MemReaderError
from memreader.core.paths import memreader_home
from memreader.eval.checkpoint import MAX_FILE_MB, restore, save
from memreader.eval.qa import QAConfig, chunk_cache_dir


def _places(args: argparse.Namespace) -> tuple[Path, Path | None]:
    cfg = load_config(QAConfig, args.config, args.set)
    eval_dir = memreader_home() / "runs" / cfg.run / "eval"
    cache = chunk_cache_dir(cfg, cfg.dataset, str(cfg.qa))  # as `memreader eval` names it (memreader.eval.qa.run_qa)
    return eval_dir, (Path(cache) if cache else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["save", "restore"])
    ap.add_argument("--config", required=True, help="the eval config the run used (configs/eval/*.yaml)")
    ap.add_argument("--set", action="append", default=[], help="the same --set overrides the run used")
    ap.add_argument("--to", type=Path, help="save: the checkpoint folder (e.g. results/<run>)")
    ap.add_argument("--from", dest="src", type=Path, help="restore: the checkpoint folder")
    ap.add_argument("--max-file-mb", type=float, default=MAX_FILE_MB, help="save: refuse any larger file")
    args = ap.parse_args(argv)
    try:
        eval_dir, cache = _places(args)
        if args.action == "save":
            if args.to is None:
                ap.error("save needs --to <folder>")
            report = save(eval_dir, args.to, cache, args.max_file_mb)
            print(report.line(f"saved {eval_dir} and {cache} to {args.to}"))
        else:
            if args.src is None:
                ap.error("restore needs --from <folder>")
            cache_root = cache.parent if cache is not None else memreader_home() / "cache" / "chunkers"
            report = restore(args.src, eval_dir, cache_root)
            others = sorted({rel.split("/")[1] for rel in report.copied + report.same + report.kept
                             if rel.startswith("cache/")} - {cache.name if cache is not None else ""})
            if others:
                print(f"WARNING: the checkpoint's chunk cache {', '.join(others)} is not the one this config uses "
                      f"({cache}): the data set file or chunk_cache differs, so the model chunkers read again",
                      file=sys.stderr)
            print(report.line(f"restored {args.src} into {eval_dir}"))
    except MemReaderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
