"""Headings as chunk ends: how many interior heading starts of ingested files end a chunk of the reader's grammar.

    .venv/bin/python scripts/bench_heading_breaks.py                    # 4 files per format, grammar only (seconds)
    .venv/bin/python scripts/bench_heading_breaks.py --read configs/inference/smollm2_cpu.yaml   # + a guided read

Builds HTML, Word and Markdown files (a title, then 3 to 6 sections of 2 to 7 sentences of the bundled demo
corpus's English documents: sections from about 150 to 900 characters, so some are shorter than the shortest
chunk), ingests them with ``memreader ingest`` and builds each record's grammar as ``memreader read`` does (its
default grammar settings, the record's heading starts as breaks; every file fits one window). Printed per format:

- ``interior``: heading starts after the document's start;
- ``possible``: the most of them one memory can end chunks at under the length range (the best path of the grammar
  built without breaks: the ceiling for any grammar);
- ``every path``: those no chunk of the grammar can cross (``meta.generation.grammar.breaks``), so every memory
  ends a chunk there;
- ``some path``: those at least one memory can end a chunk at;
- with ``--read CONFIG``: the reader is run on the corpus (guided) and ``read`` counts the heading starts where a
  chunk of its memory starts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "memreader" / "demo_data" / "corpus.jsonl"


def sentences() -> list[str]:
    texts = [json.loads(line)["text"] for line in DEMO.read_text(encoding="utf-8").splitlines()]
    return [s.strip() + "." for t in texts for s in t.replace("\n", " ").split(". ") if s.strip() and s.isascii()
            and len(s) > 30]


def build(folder: Path, per_format: int, seed: int = 0) -> None:
    from docx import Document as Docx

    rng, pool = random.Random(seed), sentences()
    for i in range(per_format):
        title = f"Field notes {i}"
        sections = [(f"Part {j + 1}", [" ".join(rng.sample(pool, rng.randint(1, 3))) for _ in range(rng.randint(2, 3))])
                    for j in range(rng.randint(3, 6))]
        html = "".join(f"<h2>{h}</h2>" + "".join(f"<p>{p}</p>" for p in ps) for h, ps in sections)
        (folder / f"notes{i}.html").write_text(f"<html><body><h1>{title}</h1>{html}</body></html>", encoding="utf-8")
        md = "\n\n".join(f"## {h}\n\n" + "\n\n".join(ps) for h, ps in sections)
        (folder / f"notes{i}.md").write_text(f"# {title}\n\n{md}\n", encoding="utf-8")
        word = Docx()
        word.add_heading(title, 0)
        for h, ps in sections:
            word.add_heading(h, 1)
            for p in ps:
                word.add_paragraph(p)
        word.save(str(folder / f"notes{i}.docx"))


def most_hits(edges: dict[int, list[int]], n: int, marks: set[int]) -> int:
    """The most ``marks`` one path from 0 to ``n`` ends chunks at."""
    best = {n: 0}
    for s in sorted(edges, reverse=True):
        best[s] = max(best[e] + (e in marks) for e in edges[s])
    return best[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=4, help="files per format")
    ap.add_argument("--read", default="", help="a reader config: also read the corpus with it (guided)")
    args = ap.parse_args()
    from memreader.core.corpus import read_corpus
    from memreader.core.memory_grammar import BoundaryGraph
    from memreader.core.structure import structural_breaks
    from memreader.inference.reader import ReadConfig
    from memreader.ingest.ingest import IngestConfig, ingest

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MEMREADER_HOME"] = str(Path(tmp) / "home")
        folder = Path(tmp) / "docs"
        folder.mkdir()
        build(folder, args.files)
        ingest(IngestConfig(inputs=[str(folder)], run="heads", workers=1), progress=False)
        corpus = Path(tmp) / "home" / "runs" / "heads" / "ingest" / "corpus.jsonl"
        cfg = ReadConfig(input=str(corpus))
        settings = cfg.grammar_settings(**cfg.marker())
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        interior_of = {}
        for doc in read_corpus(corpus):
            heads = {o for o, _ in doc.meta["headings"] if o > 0}
            interior_of[doc.doc_id] = (doc.meta["format"], heads)
            graph = BoundaryGraph.build(doc.text, settings, structural_breaks(doc.meta))
            free = BoundaryGraph.build(doc.text, settings)
            row = counts[doc.meta["format"]]
            row["files"] += 1
            row["interior"] += len(heads)
            row["possible"] += most_hits(free.edges, len(doc.text), heads)
            row["every path"] += len(heads & set(graph.breaks))
            row["some path"] += len(heads & {e for es in graph.edges.values() for e in es})
        if args.read:
            subprocess.run([sys.executable, "-m", "memreader.cli", "read", "--config", args.read, "--set", "run=heads",
                            "--set", f"input={corpus}", "--set", "guided=on"], check=True, cwd=ROOT)
            for line in (Path(tmp) / "home" / "runs" / "heads" / "read" / "memories.jsonl").open(encoding="utf-8"):
                mem = json.loads(line)
                fmt, heads = interior_of[mem["doc_id"]]
                counts[fmt]["read"] += len(heads & {sc["start"] for sc in mem["scenarios"]})
    keys = ["files", "interior", "possible", "every path", "some path"] + (["read"] if args.read else [])
    print(f"{'format':10}" + "".join(f"{k:>12}" for k in keys))
    for fmt, row in sorted(counts.items()):
        print(f"{fmt:10}" + "".join(f"{row[k]:>12}" for k in keys))
    total = {k: sum(r[k] for r in counts.values()) for k in keys}
    print(f"{'all':10}" + "".join(f"{total[k]:>12}" for k in keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
