"""SFT records (TRL conversational prompt-completion) from document memories, and their splits."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from memreader.markup import render_memory
from memreader.prompts import detect_lang, render
from memreader.schema import DocumentMemory


def sft_record(
    mem: DocumentMemory, head_chars: int = 12, tail_chars: int = 12, templates: dict[str, str] | None = None
) -> dict[str, Any]:
    """One training example: input = instruction + document, target = reasoning (if any) + memory.

    The target is rendered from the *aligned* memory, so its chunk markers are exact copies of the
    document even when the teacher's own markers were sloppy.
    """
    lang = detect_lang(mem.document)
    name = "memreader_think" if mem.reasoning else "memreader"
    prompt, tpl = render(name, lang, document=mem.document)
    if templates is not None:
        templates[tpl.id] = tpl.version
    target = render_memory(mem.outline, mem.chunks, mem.cores, mem.reasoning, head_chars, tail_chars)
    return {
        "id": mem.doc_id,
        "prompt": prompt,
        "completion": [{"role": "assistant", "content": target}],
        "meta": {"template": tpl.id, "lang": lang, "chars": len(mem.document), "scenarios": len(mem.scenarios)},
    }


def write_sft_splits(out_dir: Path, records: list[dict[str, Any]], val_fraction: float, seed: int) -> dict[str, Any]:
    """Write ``sft_train.jsonl`` / ``sft_val.jsonl``, balanced by language: the validation share is
    drawn per language so both languages appear on both sides when there are enough records, and
    at least one record is held out whenever ``val_fraction > 0`` and there are two or more."""
    by_lang: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_lang.setdefault(rec["meta"]["lang"], []).append(rec)
    rng = random.Random(seed)
    train, val = [], []
    for lang in sorted(by_lang):
        group = sorted(by_lang[lang], key=lambda r: r["id"])
        rng.shuffle(group)
        n_val = max(1, round(len(group) * val_fraction)) if val_fraction > 0 and len(group) > 1 else 0
        val += group[:n_val]
        train += group[n_val:]
    if val_fraction > 0 and not val and len(train) > 1:
        val.append(train.pop())  # every language had a single record: hold out one overall
    files = {}
    for name, rows in (("sft_train", train), ("sft_val", val)):
        path = out_dir / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        files[name] = str(path)
    return {"train": len(train), "val": len(val), "by_lang": {k: len(v) for k, v in by_lang.items()}, "files": files}
