"""SFT records (TRL conversational prompt-completion) from document memories: balancing by stratum
(language, domain, length), a stratified validation split, and checksums of what was written."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from memreader.core.language import detect_language
from memreader.core.markup import render_memory
from memreader.core.paths import sha256_file, write_jsonl
from memreader.core.prompts import ReaderPrompt
from memreader.core.schema import DocumentMemory


def sft_record(
    mem: DocumentMemory, head_chars: int = 12, tail_chars: int = 12, templates: dict[str, str] | None = None,
    domain: str | None = None, prompt: ReaderPrompt | None = None,
) -> dict[str, Any]:
    """One training example: input = instruction + document, target = reasoning (if any) + memory.

    ``prompt``: the run's reader prompt (a template file from ``prompt_template``; default: the bundled one),
    so the student learns the prompt it will be read with. The target is rendered from the *aligned* memory, so its chunk markers are exact copies of the
    document even when the teacher's own markers were sloppy.
    """
    lang = detect_language(mem.document)
    messages, tpl = replace(prompt or ReaderPrompt(), think=bool(mem.reasoning)).render(lang, mem.document)
    if templates is not None:
        templates[tpl.id] = tpl.version
    target = render_memory(mem.outline, mem.chunks, mem.cores, mem.reasoning, head_chars, tail_chars)
    return {
        "id": mem.doc_id,
        "prompt": messages,
        "completion": [{"role": "assistant", "content": target}],
        "meta": {"template": tpl.id, "lang": lang, "chars": len(mem.document), "scenarios": len(mem.scenarios),
                 **({"domain": domain} if domain is not None else {})},
    }


def stratum(rec: dict[str, Any], length_edges: list[int]) -> tuple[str, str, str]:
    """(language, domain, length bucket) of a record: the strata of balancing and of the split.
    Length buckets are document characters cut at ``length_edges`` (``<1000``, ``1000-3000``, ``>=3000``)."""
    chars = rec["meta"].get("chars", 0)
    lo = max((e for e in length_edges if e <= chars), default=None)
    hi = min((e for e in length_edges if e > chars), default=None)
    bucket = "all" if lo is None and hi is None else f"<{hi}" if lo is None else f">={lo}" if hi is None else \
        f"{lo}-{hi}"
    return rec["meta"]["lang"], str(rec["meta"].get("domain", "-")), bucket


def balance(records: list[dict[str, Any]], length_edges: list[int], max_per_stratum: int,
            seed: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """At most ``max_per_stratum`` records per (language, domain, length bucket), drawn with ``seed``
    (0 keeps everything): a domain or length that dominates the corpus cannot dominate training.
    Returns the kept records (by id) and how many each stratum dropped."""
    if max_per_stratum <= 0:
        return records, {}
    kept, dropped = [], {}
    for key, group in _shuffled_strata(records, length_edges, seed):
        kept += group[:max_per_stratum]
        if len(group) > max_per_stratum:
            dropped["/".join(key)] = len(group) - max_per_stratum
    return sorted(kept, key=lambda r: r["id"]), dropped


def _shuffled_strata(records: list[dict[str, Any]], length_edges: list[int],
                     seed: int) -> Iterator[tuple[tuple[str, str, str], list[dict[str, Any]]]]:
    """Each stratum (in order) with its records sorted by id, then shuffled by one generator seeded with ``seed``."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for rec in records:
        groups.setdefault(stratum(rec, length_edges), []).append(rec)
    rng = random.Random(seed)
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda r: r["id"])
        rng.shuffle(group)
        yield key, group


def write_sft_splits(out_dir: Path, records: list[dict[str, Any]], val_fraction: float, seed: int,
                     length_edges: list[int] | None = None) -> dict[str, Any]:
    """Write ``sft_train.jsonl`` / ``sft_val.jsonl`` with a validation share drawn per stratum
    (language, domain, length bucket; see :func:`stratum`), so every stratum with two or more
    records appears on both sides, and at least one record is held out whenever ``val_fraction > 0``
    and there are two or more. Returns counts per side and stratum, and each file's sha256."""
    edges = list(length_edges or [])
    train, val = [], []
    for _, group in _shuffled_strata(records, edges, seed):
        n_val = max(1, round(len(group) * val_fraction)) if val_fraction > 0 and len(group) > 1 else 0
        val += group[:n_val]
        train += group[n_val:]
    if val_fraction > 0 and not val and len(train) > 1:
        val.append(train.pop())  # every stratum had a single record: hold out one overall
    files, sums = {}, {}
    for name, rows in (("sft_train", train), ("sft_val", val)):
        path = out_dir / f"{name}.jsonl"
        write_jsonl(path, rows)
        files[name], sums[name] = str(path), sha256_file(path)

    def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
        return dict(sorted(Counter("/".join(stratum(r, edges)) for r in rows).items()))

    return {"train": len(train), "val": len(val), "by_lang": dict(Counter(r["meta"]["lang"] for r in records)),
            "strata": {"train": counts(train), "val": counts(val)}, "files": files, "sha256": sums}
