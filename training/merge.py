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
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from memreader.config import add_config_arguments, describe_config, field, load_config, shortcut_overrides
from memreader.errors import MemReaderError
from memreader.paths import write_json, write_resolved_config
from memreader.registry import ModelNotFoundError, resolve_model

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")


class MergeError(MemReaderError, ValueError):
    """The adapter, base or output folder cannot be used; the message says which and how to fix it."""


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


def adapter_base(adapter_dir: Path) -> str:
    """The base model an adapter was trained on: ``summary.json``'s registry name when the adapter is a
    training run folder, else ``base_model_name_or_path`` from ``adapter_config.json``."""
    summary = adapter_dir / "summary.json"
    if summary.is_file():
        model = json.loads(summary.read_text(encoding="utf-8")).get("model")
        if model:
            return str(model)
    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    if not base:
        raise MergeError(f"{adapter_dir}/adapter_config.json names no base model; set base=MODEL")
    return str(base)


def merge_adapter(
    adapter_dir: str, output_dir: str | None = None, base: str | None = None, dtype: str = "auto",
    overwrite: bool = False,
) -> Path:
    """Load ``base`` + the LoRA in ``adapter_dir``, ``merge_and_unload`` and save model + tokenizer to
    ``output_dir`` (default ``<adapter_dir>/merged``); returns the output folder."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(adapter_dir).expanduser().resolve()
    if not (adapter / "adapter_config.json").is_file():
        raise MergeError(f"{adapter} has no adapter_config.json; pass the folder a training run saved its "
                         "adapter in ($MEMREADER_HOME/runs/<run>/train)")
    if dtype not in DTYPES:
        raise MergeError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    out = Path(output_dir).expanduser().resolve() if output_dir else adapter / "merged"
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise MergeError(f"{out} exists and is not empty; choose another output (--set output=FOLDER) or "
                         "set overwrite=true")
    base_name = base or adapter_base(adapter)
    try:
        base_path = resolve_model(base_name)
    except ModelNotFoundError as err:
        raise MergeError(f"base model {base_name!r} of adapter {adapter}: {err}") from err

    start = time.perf_counter()
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype)
    model = PeftModel.from_pretrained(model, str(adapter))
    merged = model.merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(out))
    tokenizer_src = adapter if (adapter / "tokenizer_config.json").is_file() else Path(base_path)
    AutoTokenizer.from_pretrained(str(tokenizer_src)).save_pretrained(str(out))
    seconds = time.perf_counter() - start
    write_json(out / "merge_manifest.json", {
        "base": base_name, "base_path": base_path, "adapter": str(adapter), "dtype": str(merged.dtype),
        "seconds": round(seconds, 2),
    })
    log.info("merged %s into %s in %.1f s -> %s", adapter, base_name, seconds, out)
    return out


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
