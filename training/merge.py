"""Merge a trained LoRA adapter into its base model and save a standalone model folder (``memreader merge``).

Details (commands, base lookup, folder contents, memory): docs/TRAINING.md (Merging an adapter).
"""

from __future__ import annotations

from dataclasses import dataclass

from memreader.core.config import field
from memreader.core.lora import MERGE_DTYPES, MergeError, adapter_base, merge_adapter
from memreader.core.paths import write_resolved_config
from memreader.core.stage import Flag, Stage

__all__ = ["STAGE", "MergeConfig", "MergeError", "adapter_base", "merge_adapter"]


@dataclass
class MergeConfig:
    """What to merge, into what (``memreader merge --config ... --set ...``)."""

    adapter: str = field(help="LoRA folder, e.g. artifacts/runs/<run>/train (holds adapter_config.json)")
    base: str | None = field(None, help="base model (registry name, folder or hub id); default: the one the "
                             "adapter was trained on (the run's summary.json, else adapter_config.json)")
    output: str | None = field(None, help="output folder (default: <adapter>/merged)")
    dtype: str = field("checkpoint", help="dtype to load the base in and save: checkpoint (the base checkpoint's "
                       "own), auto (the machine's, as every stage: docs/ENGINES.md), float32, bfloat16, float16")
    overwrite: bool = field(False, help="write into a non-empty output folder")

    def problems(self) -> list[str]:
        """Every problem with the values, for :func:`memreader.core.config.load_config`."""
        return [] if self.dtype in MERGE_DTYPES else [f"dtype={self.dtype!r}: use one of {', '.join(MERGE_DTYPES)}"]


def _run_stage(cfg: MergeConfig) -> int:
    out = merge_adapter(cfg.adapter, cfg.output, cfg.base, cfg.dtype, cfg.overwrite)
    write_resolved_config(out, cfg, "merge_config.yaml")
    print(out)
    return 0


STAGE = Stage("merge", "merge a LoRA adapter into its base model", run=_run_stage, config=MergeConfig,
              example_dir="configs/training/ (merge.yaml)",
              flags=(Flag("adapter"), Flag("base"), Flag("output"), Flag("dtype"), Flag("overwrite", const=True)))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("merge"))
