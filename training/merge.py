"""Merge a trained LoRA adapter into its base model and save a standalone model folder.

A merged folder loads with plain ``AutoModelForCausalLM.from_pretrained`` (no PEFT), which serving
stacks without LoRA support need; vLLM can also serve the adapter unmerged (``--enable-lora``).

Commands (run from the repository root)::

    # base model read from the run's summary.json (or the adapter's adapter_config.json)
    python -m training.merge --set adapter=artifacts/runs/mr-7b/train
    # a YAML of MergeConfig keys, any of them overridden
    python -m training.merge --config configs/training/merge.yaml --set adapter=artifacts/runs/mr-7b/train \\
        --set output=artifacts/runs/mr-7b/merged --set dtype=bfloat16
    # shortcut flags for the same keys: --adapter, --base, --output, --dtype, --overwrite

The same flags work as ``memreader merge ...``. The merged folder holds ``merge_manifest.json`` and the
resolved config (``merge_config.yaml``). Merging a 7B model needs ~16 GB of CPU RAM in bf16.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from memreader.config import add_config_arguments, describe_config, field, load_config, shortcut_overrides
from memreader.errors import MemReaderError
from memreader.lora import DTYPES, MergeError, adapter_base, merge_adapter

__all__ = ["MergeConfig", "MergeError", "adapter_base", "main", "merge_adapter", "run"]
from memreader.paths import write_resolved_config

log = logging.getLogger(__name__)



@dataclass
class MergeConfig:
    """What to merge, into what (``memreader merge --config ... --set ...``)."""

    adapter: str = field(help="LoRA folder, e.g. artifacts/runs/<run>/train (holds adapter_config.json)")
    base: str | None = field(None, help="base model (registry name, folder or hub id); default: the one the "
                             "adapter was trained on (the run's summary.json, else adapter_config.json)")
    output: str | None = field(None, help="output folder (default: <adapter>/merged)")
    dtype: str = field("auto", help="dtype to load the base in and save: auto (the base checkpoint's own), "
                       "float32, bfloat16, float16")
    overwrite: bool = field(False, help="write into a non-empty output folder")

    def check(self) -> list[str]:
        """Every problem with the values, for :func:`memreader.config.load_config`."""
        return [] if self.dtype in DTYPES else [f"dtype={self.dtype!r}: use one of {', '.join(DTYPES)}"]


CONFIG_CLASS = MergeConfig  # `memreader merge --help` lists every key
SHORTCUTS = ("adapter", "base", "output", "dtype")  # --adapter X is --set adapter=X


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m training.merge`` and ``memreader merge``."""
    add_config_arguments(parser, "configs/training/ (merge.yaml)")
    for key in SHORTCUTS:
        parser.add_argument(f"--{key}", default=None, help=f"same as --set {key}=VALUE")
    parser.add_argument("--overwrite", action="store_const", const=True, default=None,
                        help="same as --set overwrite=true")


def run(args: argparse.Namespace) -> int:
    """Run from parsed flags; returns a process exit code."""
    cfg = load_config(MergeConfig, args.config, shortcut_overrides(args, (*SHORTCUTS, "overwrite")) + args.set)
    out = merge_adapter(cfg.adapter, cfg.output, cfg.base, cfg.dtype, cfg.overwrite)
    write_resolved_config(out, cfg, "merge_config.yaml")
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m training.merge --config YAML --set adapter=FOLDER``."""
    parser = argparse.ArgumentParser(prog="python -m training.merge", description=__doc__.split("\n")[0],
                                     epilog=describe_config(MergeConfig),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(parser.parse_args(argv))
    except MemReaderError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
