"""Training and dev documents with gold structure, for the structure teacher and the segmentation eval.

    python scripts/build_structure_data.py --shared ../shared/datasets --out artifacts/datasets/structure

Three kinds of document, English and Chinese, written as corpus JSONL (``id``, ``text``, ``sections``
(title + text, concatenating exactly to ``text``), ``boundaries`` (where sections 2..K start), ``titles``,
``lang``, ``source``):

- **joined** (the classic concatenation design of topic segmentation): 3-5 passages from different sources
  joined into one document. The English dev documents are a partition of every usable paragraph of the
  40 dev questions (each exactly once), so they are also the corpus of a retrieval check
  (``scripts/bench_structure_retrieval.py``: supporting-passage recall@k). English: HotpotQA-100's titled paragraphs; Chinese: CMRC 2018's titled Chinese
  Wikipedia paragraphs. Nothing in the layout marks a join: English passages are joined by one space and
  Chinese ones directly, so a rule that cuts at paragraph breaks gets no boundary for free.
- **sections**: real multi-section documents, this project's own Markdown docs cut at their ``##``
  headings into documents of 3-4 consecutive sections (the heading line starts its section). They follow the
  docs as they are when the set is built (the manifest keeps each file's sha256); the joined documents depend
  only on ``--shared`` and ``--seed``.

Train and dev never share a source title: HotpotQA is split by question (every paragraph title of a dev
question's context is dev-only), CMRC by article title, the Markdown docs by file. Each passage is its
leading sentences within the reader grammar's chunk-length range (the defaults: 150-1200 characters for
English, 60-480 for Chinese), so every gold segment is one chunk the guided reader can write; passages
shorter than the range are not used. Output: ``train.jsonl``, ``dev.jsonl`` and ``manifest.json`` (counts,
settings, sha256). The data files of ``--shared`` are read, never copied into the repository.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import random
import re
from pathlib import Path
from typing import Any

EN_RANGE = (200, 900)  # characters per English passage (the grammar allows 150-1200)
ZH_RANGE = (70, 260)  # per Chinese passage (the grammar allows 60-480; SmolLM2 spends ~1.5 tokens a character)
MAX_SCENARIOS = 8  # the grammar's default: a chunk is at least len(doc) / 8 characters long
_ZH_END = re.compile(r"[^。！？]*[。！？]+[”’」』）)]*")
_EN_END = re.compile(r".+?[.!?][\"'”’)\]]*(?=\s|$)\s*", re.S)


def _lead(sentences: list[str], lo: int, hi: int) -> str | None:
    """The passage's leading sentences, as long as possible within ``hi`` characters; None below ``lo``."""
    out = ""
    for s in sentences:
        if len(out) + len(s) > hi:
            break
        out += s
    out = out.strip()
    return out if len(out) >= lo else None


def hotpot_passages(shared: Path) -> tuple[dict[str, str], list[list[str]]]:
    """English passages by title, and each question's context titles (for the split by question)."""
    corpus = json.loads((shared / "hotpotqa_100_corpus.json").read_text(encoding="utf-8"))
    passages = {}
    for title, sents in corpus.items():
        text = _lead(sents, *EN_RANGE)
        if text and _EN_END.fullmatch(text + " "):
            passages[title] = text
    qa = json.loads((shared / "hotpotqa_100_qa.json").read_text(encoding="utf-8"))
    groups = []
    for item in qa:
        ctx = item["context"]
        ctx = ast.literal_eval(ctx) if isinstance(ctx, str) else ctx
        groups.append([title for title, _ in ctx])
    return passages, groups


def cmrc_passages(shared: Path) -> dict[str, str]:
    """Chinese passages by article title (each article's first paragraph, its leading sentences)."""
    data = json.loads((shared / "cmrc2018_dev.json").read_text(encoding="utf-8"))["data"]
    out = {}
    for art in data:
        title = art.get("title", "").strip()
        if not title or title in out:
            continue
        context = re.sub(r"\s*\n\s*", "", art["paragraphs"][0]["context"]).strip()
        text = _lead(_ZH_END.findall(context), *ZH_RANGE)
        if text:
            out[title] = text
    return out


def markdown_sections(path: Path) -> list[tuple[str, str]]:
    """(heading, text) of each ``##`` section of a Markdown file; the heading line starts the text."""
    text = path.read_text(encoding="utf-8")
    parts = re.split(r"(?m)^(?=## )", text)
    out = []
    for part in parts[1:]:
        heading = part.splitlines()[0].lstrip("#").strip()
        out.append((heading, part))
    return out


def _record(doc_id: str, sections: list[tuple[str, str]], lang: str, source: str) -> dict[str, Any]:
    text = "".join(t for _, t in sections)
    bounds, pos = [], 0
    for _, t in sections[:-1]:
        pos += len(t)
        bounds.append(pos)
    return {"id": doc_id, "text": text, "lang": lang, "source": source, "boundaries": bounds,
            "titles": [h for h, _ in sections], "sections": [{"title": h, "text": t} for h, t in sections]}


def _fits(parts: list[str], sep: str, weight: float) -> bool:
    """Every part is one chunk the reader's grammar can write (at least len(doc)/max_scenarios)."""
    n = sum(len(p) for p in parts) + len(sep) * (len(parts) - 1)
    return all(len(p) + len(sep) >= math.ceil(n / MAX_SCENARIOS) for p in parts) and n * weight < 8000


def joined_docs(passages: dict[str, str], titles: list[str], count: int, lang: str, source: str, prefix: str,
                rng: random.Random) -> list[dict[str, Any]]:
    """``count`` documents of 3-5 passages with distinct titles, joined without any layout mark."""
    sep = " " if lang == "en" else ""
    docs: list[dict[str, Any]] = []
    tries = 0
    while len(docs) < count:
        tries += 1
        if tries > count * 50:
            raise SystemExit(f"could not build {count} {lang} documents from {len(titles)} passages")
        picked = rng.sample(titles, rng.randint(3, 5))
        parts = [passages[t] for t in picked]
        if not _fits(parts, sep, 1.0 if lang == "en" else 2.5):
            continue
        sections = [(t, p + (sep if i < len(parts) - 1 else "")) for i, (t, p) in enumerate(zip(picked, parts, strict=True))]
        docs.append(_record(f"{prefix}-{len(docs):04d}", sections, lang, source))
    return docs


def partition_docs(passages: dict[str, str], titles: list[str], lang: str, source: str, prefix: str,
                   rng: random.Random) -> list[dict[str, Any]]:
    """Every passage of ``titles`` exactly once, in documents of 3-5 (a retrieval corpus: each question's
    supporting passages are somewhere in it, once)."""
    sep = " " if lang == "en" else ""
    left = list(titles)
    rng.shuffle(left)
    docs: list[dict[str, Any]] = []
    while left:
        for size in (rng.randint(3, 5), 4, 3, 5, 2, 1):
            picked = left[:size]
            parts = [passages[t] for t in picked]
            if _fits(parts, sep, 1.0 if lang == "en" else 2.5) or size == 1:
                break
        left = left[len(picked):]
        sections = [(t, p + (sep if i < len(parts) - 1 else "")) for i, (t, p) in enumerate(zip(picked, parts, strict=True))]
        docs.append(_record(f"{prefix}-{len(docs):04d}", sections, lang, source))
    return docs


def section_docs(files: list[Path], prefix: str) -> list[dict[str, Any]]:
    """Documents of 3-4 consecutive ``##`` sections of Markdown files, each section 150-2400 characters (the
    structure teacher cuts a section longer than the chunk range at sentence ends inside it)."""
    docs = []
    for path in files:
        secs = [(h, t) for h, t in markdown_sections(path) if 150 <= len(t.strip()) <= 2400]
        i = 0
        while i + 3 <= len(secs):
            group = secs[i:i + 4]
            group[-1] = (group[-1][0], group[-1][1].rstrip() + "\n")
            if _fits([t for _, t in group], "", 1.0):
                docs.append(_record(f"{prefix}-{path.stem.lower()}-{i:02d}", group, "en", f"docs/{path.name}"))
            i += 4
    return docs


def build(shared: Path, docs_dir: Path, seed: int = 7, en_train: int = 400, zh_train: int = 260, zh_dev: int = 40,
          dev_questions: int = 40) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """(train, dev, facts) as described in the module docstring: ``en_train``, ``zh_train`` and ``zh_dev`` joined
    documents, the English dev documents from the contexts of ``dev_questions`` HotpotQA questions."""
    rng = random.Random(seed)
    en, groups = hotpot_passages(shared)
    order = list(range(len(groups)))
    rng.shuffle(order)
    dev_picked = sorted(order[:dev_questions])
    dev_titles = {t for q in dev_picked for t in groups[q]}
    en_dev_pool = sorted(t for t in en if t in dev_titles)
    en_train_pool = sorted(t for t in en if t not in dev_titles)
    zh = cmrc_passages(shared)
    zh_titles = sorted(zh)
    rng.shuffle(zh_titles)
    cut = len(zh_titles) // 5
    zh_dev_pool, zh_train_pool = sorted(zh_titles[:cut]), sorted(zh_titles[cut:])
    md = sorted(docs_dir.glob("*.md"))
    md_dev = [p for p in md if p.stem in ("INGEST", "MEVE")]
    md_train = [p for p in md if p not in md_dev]
    train = (joined_docs(en, en_train_pool, en_train, "en", "hotpotqa", "en-train", rng)
             + joined_docs(zh, zh_train_pool, zh_train, "zh", "cmrc2018", "zh-train", rng)
             + section_docs(md_train, "md-train"))
    dev = (partition_docs(en, en_dev_pool, "en", "hotpotqa", "en-dev", rng)
           + joined_docs(zh, zh_dev_pool, zh_dev, "zh", "cmrc2018", "zh-dev", rng)
           + section_docs(md_dev, "md-dev"))
    shared_titles = {t for d in train for t in d["titles"]} & {t for d in dev for t in d["titles"]}
    if shared_titles:
        raise SystemExit(f"train and dev share source titles: {sorted(shared_titles)[:5]}")
    facts = {"seed": seed, "dev_questions": dev_picked, "passages": {
        "en_train": len(en_train_pool), "en_dev": len(en_dev_pool), "zh_train": len(zh_train_pool),
        "zh_dev": len(zh_dev_pool)}, "markdown": {"train": [p.name for p in md_train], "dev": [p.name for p in md_dev]},
        "ranges": {"en": EN_RANGE, "zh": ZH_RANGE},
        # the multi-section documents follow this project's docs as they are when the set is built: their hashes
        # say which version a data set (and an adapter trained on it) saw
        "markdown_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in md}}
    return train, dev, facts


def _write(path: Path, records: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["source"].split("/")[0], []).append(r)
    return {k: {"documents": len(v), "mean_chars": round(sum(len(r["text"]) for r in v) / len(v), 1),
                "mean_sections": round(sum(len(r["titles"]) for r in v) / len(v), 2)} for k, v in sorted(by.items())}


def main(argv: list[str] | None = None) -> int:
    """Build and write the data set; prints one line per split."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default="../shared/datasets", help="folder with hotpotqa_100_*.json and cmrc2018_dev.json")
    ap.add_argument("--docs", default="docs", help="folder of Markdown documents for the multi-section documents")
    ap.add_argument("--out", default="artifacts/datasets/structure", help="output folder")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--en-train", type=int, default=400, help="English joined training documents")
    ap.add_argument("--zh-train", type=int, default=260, help="Chinese joined training documents")
    ap.add_argument("--zh-dev", type=int, default=40, help="Chinese joined dev documents")
    ap.add_argument("--dev-questions", type=int, default=40,
                    help="HotpotQA questions whose context paragraphs are dev-only (the English dev documents)")
    args = ap.parse_args(argv)
    shared, out = Path(args.shared), Path(args.out)
    missing = [f for f in ("hotpotqa_100_corpus.json", "hotpotqa_100_qa.json", "cmrc2018_dev.json")
               if not (shared / f).is_file()]
    if missing:
        raise SystemExit(f"{shared}: missing {', '.join(missing)} (give --shared the folder of the benchmark files)")
    train, dev, facts = build(shared, Path(args.docs), args.seed, args.en_train, args.zh_train, args.zh_dev,
                              args.dev_questions)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {**facts, "train": _summary(train), "dev": _summary(dev),
                "sha256": {"train": _write(out / "train.jsonl", train), "dev": _write(out / "dev.jsonl", dev)}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for split, recs in (("train", train), ("dev", dev)):
        print(f"{split}: {len(recs)} documents {manifest[split]} → {out / (split + '.jsonl')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
