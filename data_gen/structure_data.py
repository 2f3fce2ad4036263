"""``memreader structure-data``: documents with gold structure, English and Chinese, for the cut head, the structure
teacher and the segmentation eval: **joined** passages of one public corpus (HotpotQA, CMRC 2018, CRUD-RAG, LongBench)
or manual with nothing marking the joins, and **sections** of real manuals (run ``memreader ingest`` first).

    memreader structure-data --set shared=../shared/datasets
    memreader ingest /usr/share/doc/python3/html/library --set run=python3-doc       # a real manual, once
    memreader structure-data --set shared=../shared/datasets --set 'manuals=[python3-doc,debian-reference-zh-cn]'

Writes ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` (splits share no unit; records ``id``, ``text``,
``boundaries`` (where sections 2..K start), ``titles``, ``sections``, ``lang``, ``source``, ``group``, ``kind``)
and ``manifest.json`` (counts, settings, sha256 of every input and output) to ``out`` (default
``$MEMREADER_HOME/datasets/structure``). Details: docs/TRAINING.md (A teacher that knows the answer: the structure
teacher).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.paths import memreader_home, sha256_file, write_jsonl
from memreader.core.stage import Stage
from memreader.data_gen.structure_sources import (
    DEBIAN_MANUALS,
    EN_RANGE,
    ZH_RANGE,
    Page,
    Passage,
    StructureDataError,
    cmrc_passages,
    crud_passages,
    hotpot_passages,
    lead,
    longbench_passages,
    manual_pages,
    markdown_pages,
    resolve_manual,
    section_passages,
)

MAX_SCENARIOS = 8  # the reader grammar's chunk count: every part at least len(doc) / 8 characters
SPLITS = ("train", "dev", "test")


@dataclass
class StructureDataConfig:
    """Settings of ``memreader structure-data``."""

    shared: str = field("../shared/datasets", help="folder of the benchmark files (hotpotqa_100_*.json, "
                        "cmrc2018_dev.json, crud_event_summary.jsonl, longbench_multifieldqa_zh.jsonl)")
    docs: str = field("docs", help="folder of Markdown docs cut at their ## headings ('' = none)")
    manuals: list = field([], help=f"ingested manuals: corpus JSONL paths, or the names of Debian manuals "
                          f"({', '.join(DEBIAN_MANUALS)}: their corpus under $MEMREADER_HOME/runs/<name>/ingest/)")
    out: str = field("", help="output folder ('' = $MEMREADER_HOME/datasets/structure)")
    seed: int = field(7, ge=0, help="one seed for every draw")
    joined_train: int = field(5000, ge=0, help="joined training documents, shared by the languages by passage supply")
    joined_zh_dev: int = field(60, ge=0, help="Chinese joined dev documents (and as many for test)")
    dev_questions: int = field(40, ge=1, help="HotpotQA questions whose paragraphs are dev-only (English dev corpus)")
    test_questions: int = field(20, ge=1, help="HotpotQA questions whose paragraphs are test-only")
    heldout_share: float = field(0.1, gt=0, lt=0.5, help="share of the other units held out for dev, and for test")
    min_parts: int = field(2, ge=2, help="fewest passages or sections in a document")
    max_parts: int = field(6, ge=2, le=MAX_SCENARIOS, help="most passages or sections in a document")

    def problems(self) -> list[str]:
        return ([f"min_parts={self.min_parts} must be <= max_parts={self.max_parts}"]
                if self.min_parts > self.max_parts else [])


def _split_of(unit: str, seed: int, share: float) -> str:
    """dev / test / train by a hash of the unit (stable whatever else the data holds)."""
    x = int(hashlib.sha256(f"{seed}:{unit}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "dev" if x < share else "test" if x < 2 * share else "train"


def _record(doc_id: str, parts: list[tuple[str, str]], lang: str, source: str, kind: str, group: str) -> dict:
    text = "".join(t for _, t in parts)
    bounds = list(itertools.accumulate(len(t) for _, t in parts[:-1]))
    return {"id": doc_id, "text": text, "lang": lang, "source": source, "kind": kind, "group": group,
            "boundaries": bounds, "titles": [h for h, _ in parts], "sections": [{"title": h, "text": t} for h, t in parts]}


def _joined_record(doc_id: str, picked: list[Passage], source: str) -> dict:
    """Passages joined without any layout mark (one space in English, nothing in Chinese)."""
    sep = " " if picked[0].lang == "en" else ""
    parts = [(p.title, p.text + (sep if i < len(picked) - 1 else "")) for i, p in enumerate(picked)]
    return _record(doc_id, parts, picked[0].lang, source, "joined", "+".join(p.unit for p in picked))


def _fits(parts: list[str], lang: str) -> bool:
    """Every part can be one chunk of the reader's grammar (at least len(doc) / 8) and the whole fits one read."""
    n = sum(len(p) for p in parts)
    return all(len(p) >= math.ceil(n / MAX_SCENARIOS) for p in parts) and n * (1.0 if lang == "en" else 2.5) < 8000


class _Dealer:
    """Passages dealt from a shuffled pool, reshuffled when it runs out: each is used about equally often."""

    def __init__(self, passages: list[Passage], rng: random.Random) -> None:
        self.passages, self.rng, self.left = passages, rng, []

    def deal(self, k: int) -> list[int]:
        picked: list[int] = []
        units: set[str] = set()
        tries = 0
        while len(picked) < k:
            if not self.left:
                self.left = list(range(len(self.passages)))
                self.rng.shuffle(self.left)
            i = self.left.pop()
            tries += 1
            if self.passages[i].unit in units and tries < 50 * k:
                self.left.insert(0, i)
                continue
            picked.append(i)
            units.add(self.passages[i].unit)
        return picked


def joined(passages: list[Passage], count: int, prefix: str, cfg: StructureDataConfig, rng: random.Random) -> list[dict]:
    """``count`` documents of ``min_parts``-``max_parts`` passages of one source each, from different units."""
    by_source: dict[str, list[Passage]] = {}
    for p in passages:
        by_source.setdefault(p.source, []).append(p)
    units = {s: len({p.unit for p in ps}) for s, ps in by_source.items()}
    dealers = {s: _Dealer(ps, rng) for s, ps in sorted(by_source.items()) if units[s] >= cfg.min_parts}
    if count and not dealers:
        raise StructureDataError(f"no source has passages from {cfg.min_parts} different units for {prefix}",
                                 "give more data (shared=, manuals=) or lower max_parts")
    weights = {s: len(by_source[s]) for s in dealers}
    docs: list[dict] = []
    tries = 0
    while len(docs) < count:
        tries += 1
        if tries > 50 * count:
            raise StructureDataError(f"could not build {count} joined documents for {prefix} (built {len(docs)})",
                                     "lower the count or give more passages")
        source = rng.choices(list(weights), weights=list(weights.values()))[0]
        dealer = dealers[source]
        k = min(units[source], rng.randint(cfg.min_parts, cfg.max_parts))
        picked = [dealer.passages[i] for i in dealer.deal(k)]
        if len({p.unit for p in picked}) < len(picked) or not _fits([p.text for p in picked], picked[0].lang):
            continue
        docs.append(_joined_record(f"{prefix}-{len(docs):05d}", picked, source))
    return docs


def partition(passages: list[Passage], prefix: str, cfg: StructureDataConfig, rng: random.Random) -> list[dict]:
    """Every passage exactly once, in documents of ``min_parts``-``max_parts`` (fewer at the end)."""
    left = list(passages)
    rng.shuffle(left)
    docs: list[dict] = []
    while left:
        for size in (rng.randint(max(3, cfg.min_parts), min(5, cfg.max_parts)), 4, 3, 2, 1):
            picked = left[:size]
            if _fits([p.text for p in picked], picked[0].lang) or size == 1:
                break
        left = left[len(picked):]
        docs.append(_joined_record(f"{prefix}-{len(docs):04d}", picked, picked[0].source))
    return docs


def sectioned(pages: list[Page], prefix: str, cfg: StructureDataConfig, rng: random.Random) -> list[dict]:
    """Runs of ``min_parts``-``max_parts`` consecutive sections of each page, each section its leading paragraphs
    within the chunk range (a section too short to be a chunk ends the run)."""
    docs = []
    for page in pages:
        bounds = EN_RANGE if page.lang == "en" else ZH_RANGE
        secs = [(s.title, lead(s.text, page.lang, rng, (bounds[0], bounds[1] * 2))) for s in page.sections]
        run: list[tuple[str, str]] = []
        want = rng.randint(cfg.min_parts, cfg.max_parts)
        for title, body in [*secs, ("", None)]:
            if body is not None and len(run) < want:
                run.append((title, body))
                continue
            if len(run) >= cfg.min_parts and _fits([b for _, b in run], page.lang):
                sep = "\n\n"
                parts = [(t, b + (sep if i < len(run) - 1 else "\n")) for i, (t, b) in enumerate(run)]
                docs.append(_record(f"{prefix}-{len(docs):04d}", parts, page.lang, page.source, "sections", page.unit))
            run, want = ([(title, body)] if body is not None else []), rng.randint(cfg.min_parts, cfg.max_parts)
    return docs


def build(cfg: StructureDataConfig) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """(documents by split, facts for the manifest)."""
    rng = random.Random(cfg.seed)
    shared = Path(cfg.shared)
    en, groups = hotpot_passages(shared, rng)
    order = list(range(len(groups)))
    rng.shuffle(order)
    if cfg.dev_questions + cfg.test_questions >= len(groups):
        raise StructureDataError(f"dev_questions + test_questions = {cfg.dev_questions + cfg.test_questions} leave no "
                                 f"training question of {len(groups)}", "lower them")
    dev_q, test_q = sorted(order[:cfg.dev_questions]), sorted(order[cfg.dev_questions:cfg.dev_questions +
                                                                     cfg.test_questions])
    dev_titles = {t for q in dev_q for t in groups[q]}
    test_titles = {t for q in test_q for t in groups[q]} - dev_titles
    zh = cmrc_passages(shared, rng) + crud_passages(shared, rng) + longbench_passages(shared, rng)
    pages = markdown_pages(Path(cfg.docs)) if cfg.docs else []
    for entry in cfg.manuals:
        pages += manual_pages(resolve_manual(str(entry), memreader_home()))
    page_split = {p.unit: ("dev" if p.source.endswith(("INGEST.md", "MEVE.md")) else "train") if p.unit.startswith(
        "docs:") else _split_of(p.unit, cfg.seed, cfg.heldout_share) for p in pages}
    pool: dict[str, list[Passage]] = {s: [] for s in SPLITS}
    for p in [*zh, *section_passages(pages, rng)]:
        split = page_split.get(p.unit) or _split_of(p.unit, cfg.seed, cfg.heldout_share)
        pool[split].append(p)
    pool["train"] += [p for p in en if p.title not in dev_titles | test_titles]
    n_en = sum(p.lang == "en" for p in pool["train"])
    share_en = n_en / max(1, len(pool["train"]))
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    # each split draws from its own generator: the size of one (joined_train) never changes the documents of another
    draw = {s: random.Random(f"{cfg.seed}:{s}") for s in SPLITS}
    out["train"] = (joined([p for p in pool["train"] if p.lang == "en"], round(cfg.joined_train * share_en),
                           "en-train", cfg, draw["train"])
                    + joined([p for p in pool["train"] if p.lang == "zh"], cfg.joined_train - round(
                        cfg.joined_train * share_en), "zh-train", cfg, draw["train"]))
    for split, titles in (("dev", dev_titles), ("test", test_titles)):
        manual_en = [p for p in pool[split] if p.lang == "en" and p.source != "hotpotqa"]
        out[split] = (partition([p for p in en if p.title in titles], f"en-{split}", cfg, draw[split])
                      + joined([p for p in pool[split] if p.lang == "zh"], cfg.joined_zh_dev, f"zh-{split}", cfg,
                               draw[split])
                      + joined(manual_en, cfg.joined_zh_dev if manual_en else 0, f"en-{split}-man", cfg, draw[split]))
    for split in SPLITS:
        out[split] += sectioned([p for p in pages if page_split[p.unit] == split], f"sec-{split}", cfg, draw[split])
    units = {s: {u for d in out[s] for u in d["group"].split("+")} for s in SPLITS}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        if units[a] & units[b]:
            raise StructureDataError(f"{a} and {b} share units {sorted(units[a] & units[b])[:3]}", "a bug: report it")
    # how often each passage (or section) text was used, per split
    uses = [n for s in SPLITS for n in Counter(sec["text"].strip() for d in out[s] for sec in d["sections"]).values()]
    facts = {"dev_questions": dev_q, "test_questions": test_q, "ranges": {"en": EN_RANGE, "zh": ZH_RANGE},
             "passages": {s: {"en": sum(p.lang == "en" for p in pool[s]), "zh": sum(p.lang == "zh" for p in pool[s])}
                          for s in SPLITS},
             "passage_uses": {"max": max(uses, default=0), "mean": round(sum(uses) / max(1, len(uses)), 2)},
             "pages": {s: sum(v == s for v in page_split.values()) for s in SPLITS}}
    return out, facts


def _summary(records: list[dict]) -> dict[str, Any]:
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(f"{r['kind']}/{r['lang']}/{r['source'].split('/')[0]}", []).append(r)
    return {k: {"documents": len(v), "mean_chars": round(sum(len(r["text"]) for r in v) / len(v), 1),
                "mean_sections": round(sum(len(r["titles"]) for r in v) / len(v), 2)} for k, v in sorted(by.items())}


def write_structure_data(cfg: StructureDataConfig) -> dict[str, Any]:
    """Build and write the three splits and the manifest; returns the manifest."""
    out_dir = Path(cfg.out) if cfg.out else memreader_home() / "datasets" / "structure"
    docs, facts = build(cfg)
    sha = {split: sha256_file(write_jsonl(out_dir / f"{split}.jsonl", docs[split])) for split in SPLITS}
    inputs = sorted(Path(cfg.shared).glob("*.json*"))
    manifest = {"settings": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__ if k != "out"}, **facts,
                **{split: _summary(docs[split]) for split in SPLITS}, "sha256": sha,
                "inputs_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in inputs}}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for split in SPLITS:
        n_bounds = sum(len(d["boundaries"]) for d in docs[split])
        print(f"structure-data: {split}: {len(docs[split])} documents, {n_bounds} gold boundaries → "
              f"{out_dir / (split + '.jsonl')}")
    print(f"structure-data: passages used at most {facts['passage_uses']['max']} times (mean "
          f"{facts['passage_uses']['mean']}); manual pages {facts['pages']}")
    return manifest


STAGE = Stage("structure-data", "documents with gold structure (joined passages, manual sections) for the cut head "
              "and the segmentation eval", run=write_structure_data, config=StructureDataConfig,
              example_dir="configs/data_gen/")

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("structure-data"))
