"""``memreader ingest`` on a mixed folder it builds, and the PDF extractor chosen by measurement.

    .venv/bin/python scripts/bench_ingest.py                  # 120 files (24 PDFs of 2 to 40 pages), one run
    .venv/bin/python scripts/bench_ingest.py --files 240 --workers 2

The folder is generated (nothing downloaded): sentences of the bundled demo corpus (English: fpdf2's core fonts
are Latin only), written as PDF (fpdf2, 2 to 40 pages), DOCX (python-docx, with headings and a table), HTML
(headings, lists, a script), Markdown and plain text, in equal shares. Printed side by side in one run:

1. **PDF extractors** on the same PDFs: pypdf and pdfminer.six, pages/s and MB/s, and how much of the text each
   recovers (the share of the words written into the PDF that are found, in order, in the extracted text);
2. **ingest** of the whole folder (``workers`` processes), files/s and MB/s per format, then a rerun (every file
   unchanged: hashing only) and its speed-up.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "memreader" / "demo_data" / "corpus.jsonl"


def paragraphs(n: int, rng: random.Random) -> list[str]:
    texts = [json.loads(line)["text"] for line in DEMO.read_text(encoding="utf-8").splitlines()]
    sentences = [s.strip() + "." for t in texts for s in t.replace("\n", " ").split(".") if s.strip()
                 and s.isascii()]  # the English documents: fpdf2's core fonts are Latin only
    return [" ".join(rng.choice(sentences) for _ in range(rng.randint(3, 8))) for _ in range(n)]


WRITTEN: dict[Path, str] = {}
"""The text written into each generated PDF (the reference its extraction is checked against)."""


def build(folder: Path, files: int, seed: int = 0) -> dict[str, list[Path]]:
    from docx import Document as Docx
    from fpdf import FPDF

    rng = random.Random(seed)
    made: dict[str, list[Path]] = defaultdict(list)
    kinds = ["pdf", "docx", "html", "markdown", "text"]
    for i in range(files):
        kind = kinds[i % len(kinds)]
        paras = paragraphs(rng.randint(4, 30) if kind != "pdf" else 1, rng)
        sub = folder / kind / f"part{i % 4}"
        sub.mkdir(parents=True, exist_ok=True)
        if kind == "pdf":
            pages = rng.choice([2, 5, 10, 20, 40])
            pdf = FPDF()
            pdf.set_font("Helvetica", size=11)
            written = []
            for _ in range(pages):
                pdf.add_page()
                written.append("\n\n".join(paragraphs(6, rng)))
                pdf.multi_cell(0, 6, written[-1])
            path = sub / f"doc{i:04d}.pdf"
            WRITTEN[path] = "\n\n".join(written)
            pdf.output(str(path))
        elif kind == "docx":
            doc = Docx()
            doc.add_heading(f"Report {i}", 0)
            for j, p in enumerate(paras):
                if j % 5 == 0:
                    doc.add_heading(f"Section {j // 5 + 1}", 1)
                doc.add_paragraph(p)
            table = doc.add_table(rows=2, cols=2)
            table.rows[0].cells[0].text = "item"
            path = sub / f"doc{i:04d}.docx"
            doc.save(str(path))
        elif kind == "html":
            body = "".join(f"<h2>Part {j}</h2><p>{p}</p>" if j % 4 == 0 else f"<p>{p}</p>" for j, p in enumerate(paras))
            path = sub / f"doc{i:04d}.html"
            path.write_text(f"<html><head><script>var x = 1;</script></head><body><h1>Page {i}</h1>{body}"
                            "<ul><li>one</li><li>two</li></ul></body></html>", encoding="utf-8")
        elif kind == "markdown":
            path = sub / f"doc{i:04d}.md"
            path.write_text(f"# Notes {i}\n\n" + "\n\n".join(f"## Topic {j}\n\n{p}" if j % 4 == 0 else p
                                                             for j, p in enumerate(paras)) + "\n", encoding="utf-8")
        else:
            path = sub / f"doc{i:04d}.txt"
            path.write_text("\n\n".join(paras) + "\n", encoding="utf-8")
        made[kind].append(path)
    return made


def recovered(reference_words: list[str], text: str) -> float:
    """Share of the words (in order) found in ``text``: a cheap fidelity check of an extractor."""
    found, pos = 0, 0
    for word in reference_words:
        at = text.find(word, pos)
        if at >= 0:
            found, pos = found + 1, at + len(word)
    return found / max(1, len(reference_words))


def bench_pdf(pdfs: list[Path]) -> dict[str, dict[str, float]]:
    from pdfminer.high_level import extract_text as miner_text
    from pypdf import PdfReader

    def pypdf_text(path: Path) -> tuple[str, int]:
        reader = PdfReader(str(path))
        return "\n\n".join(p.extract_text() or "" for p in reader.pages), len(reader.pages)

    def pdfminer_text(path: Path) -> tuple[str, int]:
        from pypdf import PdfReader as Count

        return miner_text(str(path)), len(Count(str(path)).pages)

    reference = {p: WRITTEN[p].split() for p in pdfs}  # the words written into the file, in order
    out = {}
    size = sum(p.stat().st_size for p in pdfs) / 1e6
    for name, fn in (("pypdf", pypdf_text), ("pdfminer.six", pdfminer_text)):
        t0, pages, shares = time.perf_counter(), 0, []
        for path in pdfs:
            text, n = fn(path)
            pages += n
            shares.append(recovered(reference[path], " ".join(text.split())))
        dt = time.perf_counter() - t0
        out[name] = {"pages_per_s": pages / dt, "mb_per_s": size / dt, "seconds": dt,
                     "recovered": statistics.mean(shares)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=120)
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    import os

    from memreader.ingest.ingest import IngestConfig, ingest

    with tempfile.TemporaryDirectory() as tmp:
        folder, home = Path(tmp) / "docs", Path(tmp) / "home"
        t0 = time.perf_counter()
        made = build(folder, args.files)
        print(f"built {args.files} files in {time.perf_counter() - t0:.1f} s: "
              + ", ".join(f"{len(v)} {k}" for k, v in sorted(made.items())))
        pdf = bench_pdf(made["pdf"])
        print(f"\n{'PDF extractor':<14}{'pages/s':>9}{'MB/s':>7}{'words found':>13}")
        for name, r in pdf.items():
            print(f"{name:<14}{r['pages_per_s']:>9.1f}{r['mb_per_s']:>7.2f}{r['recovered']:>13.1%}")
        os.environ["MEMREADER_HOME"] = str(home)
        per_format: dict[str, dict[str, float]] = {}
        for kind, paths in sorted(made.items()):  # per format, each in its own folder
            cfg = IngestConfig(inputs=[str(folder / kind)], run=f"bench-{kind}", workers=args.workers)
            t0 = time.perf_counter()
            summary = ingest(cfg, progress=False)
            dt = time.perf_counter() - t0
            mb = sum(p.stat().st_size for p in paths) / 1e6
            per_format[kind] = {"files": len(paths), "files_per_s": len(paths) / dt, "mb_per_s": mb / dt,
                                "documents": summary["documents"]}
        cfg = IngestConfig(inputs=[str(folder)], run="bench-all", workers=args.workers)
        t0 = time.perf_counter()
        ingest(cfg, progress=False)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        ingest(cfg, progress=False)
        again = time.perf_counter() - t0
        total_mb = sum(p.stat().st_size for v in made.values() for p in v) / 1e6
        print(f"\n{'format':<10}{'files':>7}{'files/s':>9}{'MB/s':>7}")
        for kind, r in per_format.items():
            print(f"{kind:<10}{r['files']:>7}{r['files_per_s']:>9.1f}{r['mb_per_s']:>7.2f}")
        print(f"\nall {args.files} files ({total_mb:.1f} MB), workers={args.workers or os.cpu_count()}: "
              f"{first:.1f} s ({args.files / first:.1f} files/s, {total_mb / first:.2f} MB/s); rerun with every "
              f"file unchanged {again:.2f} s ({first / again:.0f}x faster)")
        shutil.rmtree(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
