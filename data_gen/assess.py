"""``memreader assess``: clarity and completeness of any memories file, written next to it.

    memreader assess --input artifacts/runs/demo/read/memories.jsonl
    memreader assess --input baseline_chunks.jsonl --set clarity_variant=prob --set evaluator=<folder>

Every memory is scored by the evaluator LM of :mod:`memreader.core.scoring`: atomic-chunk clarity
always, core-content completeness when the memory has cores (chunk-only memories, such as a
fixed-length chunking baseline, get clarity alone). Writes ``<name>.scores.jsonl`` (one row per
memory: ``doc_id`` and the full, recomputable score record) and ``<name>.scores.json`` (means,
counts, the evaluator's settings and the input's sha256) beside the input, plus the resolved config
as ``<name>.scores.config.yaml``. The evaluation harness uses it to score chunking baselines.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tqdm.auto import tqdm

from memreader.core.config import ConfigError, field
from memreader.core.paths import sha256_file, write_json, write_jsonl, write_resolved_config
from memreader.core.schema import read_memories
from memreader.core.scoring import evaluator_scorer
from memreader.core.scoring_settings import EvaluatorConfig
from memreader.core.stage import Flag, Stage


@dataclass
class AssessConfig(EvaluatorConfig):
    """Settings of one ``memreader assess`` run (the evaluator's keys from :class:`EvaluatorConfig`)."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "backend": "evaluator_backend", "dtype": "evaluator_dtype", "device": "evaluator_device",
        "max_batch_tokens": "evaluator_batch_tokens"}

    input: str = field("", help="memories JSONL (from gen, read, or a chunking baseline)")
    block: int = field(32, ge=1, help="memories per scorer call (one progress step)")

    def problems(self) -> list[str]:
        """Problems a config can have beyond types and the evaluator's keys."""
        if not self.input:
            return ["input: give a memories JSONL (--input FILE)"]
        return [] if Path(self.input).is_file() else [f"input: {self.input} does not exist"]


def outputs(input_path: str | Path) -> dict[str, Path]:
    """Where the scores of ``input_path`` go (beside it)."""
    p = Path(input_path)
    stem = p.name[: -len(".jsonl")] if p.name.endswith(".jsonl") else p.name
    return {"scores": p.with_name(f"{stem}.scores.jsonl"), "summary": p.with_name(f"{stem}.scores.json"),
            "config": p.with_name(f"{stem}.scores.config.yaml")}


def _mean(values: list[float]) -> float | None:
    return round(math.fsum(values) / len(values), 6) if values else None


def assess(cfg: AssessConfig, scorer: Any | None = None) -> dict[str, Any]:
    """Score every memory of ``cfg.input``; returns the summary (also written beside the input)."""
    memories = read_memories(cfg.input)
    if not memories:
        raise ConfigError(f"{cfg.input} holds no memories", "give a memories JSONL written by gen, read or a chunker")
    out = outputs(cfg.input)
    write_resolved_config(out["config"].parent, cfg, out["config"].name)
    if scorer is None:
        scorer = evaluator_scorer(cfg)
        choice = scorer.choice
        print(f"assess: evaluator on {choice.backend} ({choice.dtype}, {choice.device}; {choice.why})")
    t0 = time.perf_counter()
    rows = []
    with tqdm(total=len(memories), desc="assess", unit="memory") as bar:
        for lo in range(0, len(memories), cfg.block):
            block = memories[lo: lo + cfg.block]
            rows += [{"doc_id": mem.doc_id, **score.to_dict()} for mem, score in zip(block, scorer.score(block),
                                                                                      strict=True)]
            bar.update(len(block))
    write_jsonl(out["scores"], rows)
    seconds = time.perf_counter() - t0
    clarity = [r["clarity"] for r in rows if not r.get("single_chunk")]
    completeness = [r["completeness"] for r in rows if r.get("completeness") is not None]
    summary = {
        "input": str(cfg.input), "input_sha256": sha256_file(cfg.input), "memories": len(rows),
        "single_chunk": sum(1 for r in rows if r.get("single_chunk")),
        "with_cores": len(completeness),
        "mean_clarity": _mean(clarity), "mean_completeness": _mean(completeness),
        "clarity_variant": cfg.clarity_variant, "evaluator": scorer.signature(),
        "seconds": round(seconds, 2), "files": {k: str(v) for k, v in out.items()},
        "scores_sha256": sha256_file(out["scores"]),
    }
    write_json(out["summary"], summary)
    chunk_only = len(rows) - len(completeness)
    print(f"assess: {len(rows)} memories, mean clarity ({cfg.clarity_variant}) {summary['mean_clarity']} over "
          f"{len(clarity)} with a boundary, mean completeness {summary['mean_completeness']} over {len(completeness)} "
          f"with cores ({chunk_only} chunk-only) in {seconds:.1f}s → {out['scores']}")
    empty_cores = [r["doc_id"] for r in rows if r.get("chunk_terms") is not None and r.get("chunk_ppl") is not None
                   and any(p is None for p in r["chunk_ppl"])]
    if empty_cores:
        print(f"NOTE: {len(empty_cores)} memory(ies) have some empty cores, each scored 0 in completeness (the "
              f"worst value): {empty_cores[:5]} — give every scenario a core, or leave all cores empty to "
              "score clarity alone")
    if summary["single_chunk"]:
        print(f"NOTE: {summary['single_chunk']} memory(ies) have one chunk and no boundary: their clarity is the "
              "variant's neutral value (0.5; margin 0.0), flagged single_chunk and left out of the mean")
    return summary


STAGE = Stage("assess", "clarity/completeness of any memories file (evaluator LM), written beside it", run=assess,
              config=AssessConfig, example_dir="configs/data_gen/",
              flags=(Flag("input", help="memories JSONL to score (same as --set input=FILE)"),))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("assess"))
