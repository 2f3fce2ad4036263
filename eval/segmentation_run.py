"""``memreader eval`` with ``dataset: gold_segments``: every method's memories of the gold documents, scored
against the gold boundaries (:mod:`memreader.eval.segmentation`) instead of answering questions.

    memreader eval --config configs/eval/segmentation_demo.yaml
    memreader eval --config configs/eval/segmentation_demo.yaml --set qa=my_gold.jsonl --set target_chars=400

Methods, calibration and the outputs under ``runs/<run>/segmentation/``: docs/EVALUATION.md (Segmentation against
gold boundaries).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from memreader.core.config import validate as validate_config
from memreader.core.paths import run_dir, sha256_file, write_json, write_resolved_config
from memreader.core.schema import DocumentMemory, read_memories, write_memories
from memreader.eval.chunkers import ChunkerSettings, method_memories
from memreader.eval.gold_segments import load_gold_segments, score_memories
from memreader.eval.segmentation import SegmentationScores, SegmentationSettings, format_table


def run_segmentation(gold_path: str | Path, methods: list[str], chunker: ChunkerSettings, *, run: str,
                     settings: SegmentationSettings | None = None, memories: str = "", limit: int = 0,
                     allow_missing: bool = False, config: Any = None) -> dict[str, Any]:
    """Score every method's segmentation of the gold documents in ``gold_path``; returns the summary.

    ``memories``: the ``memreader`` method's memories file (used as is; ``allow_missing`` lets it lack gold
    documents, which are then counted as missing). ``config``: the resolved config, written beside the outputs.
    """
    t_run = time.perf_counter()
    settings = settings or SegmentationSettings()
    validate_config(settings)
    gold = load_gold_segments(gold_path, limit)
    documents = {g.id: g.text for g in gold}
    segments = [e - s for g in gold for s, e in g.segments]
    mean_segment = sum(segments) / len(segments)
    out_dir = run_dir(run, "segmentation")
    if config is not None:
        write_resolved_config(out_dir, config)
    print(f"eval: segmentation: {len(gold)} gold documents, {len(segments)} gold segments of {mean_segment:.1f} "
          f"chars on average; methods {', '.join(methods)}; calibrated to {chunker.target_chars} chars")
    results: dict[str, SegmentationScores] = {}
    calibrations: dict[str, Any] = {}
    for method in methods:
        mdir = out_dir / "methods" / method
        t0 = time.perf_counter()
        if method == "memreader" and memories:
            mems: list[DocumentMemory] = read_memories(memories)
            calibrations[method] = {"method": method, "param": "memories", "value": str(memories),
                                    "note": "given memories: not calibrated"}
            missing_ok = allow_missing
        else:
            mems, cal = method_memories(method, documents, chunker, mdir / "work")
            calibrations[method] = cal.to_dict()
            missing_ok = False  # a method run here reads every gold document, or it is a bug
        write_memories(mdir / "memories.jsonl", [m for m in mems if m.doc_id in documents])
        results[method] = score_memories(gold, mems, settings, allow_missing=missing_ok)
        write_json(mdir / "scores.json", results[method].to_dict())
        print(f"eval: {method}: F1 {results[method].f1:.4f}, Pk {results[method].pk:.4f} over "
              f"{results[method].n_docs} documents in {time.perf_counter() - t0:.1f} s", flush=True)
    table = format_table(results)
    summary = {
        "task": "segmentation",
        "gold": {"path": str(gold_path), "sha256": sha256_file(gold_path), "n_docs": len(gold),
                 "n_segments": len(segments), "mean_segment_chars": round(mean_segment, 1)},
        "settings": {"tolerance": settings.tolerance, "window": settings.window,
                     "target_chars": chunker.target_chars, "allow_missing": allow_missing},
        "signature": settings.signature(),
        "methods": {m: {**r.to_dict(documents=False), "calibration": calibrations[m]} for m, r in results.items()},
        "seconds": round(time.perf_counter() - t_run, 1),
    }
    write_json(out_dir / "summary.json", summary)
    (out_dir / "report.txt").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"eval: segmentation: {len(methods)} methods x {len(gold)} documents in {summary['seconds']:.0f} s → "
          f"{out_dir / 'summary.json'}")
    return summary
