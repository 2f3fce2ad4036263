"""``memreader ingest``: files, folders and globs of PDF, Word, HTML, Markdown and text into a reading corpus.

    memreader ingest docs/ reports/*.pdf notes.md --set run=mydocs
    memreader read --config configs/inference/smollm2_cpu.yaml --set input=artifacts/runs/mydocs/ingest/corpus.jsonl

Each file becomes one corpus record (``id`` its path relative to the folder given, ``text``, ``source``, ``sha256``,
``format``, and ``pages`` / ``headings`` maps); JSONL and Parquet corpora pass through record by record. Reruns
skip unchanged files. A file that gives no text is reported with the fix and left out; the run goes on. Exit 0
when the corpus holds documents, 1 when nothing could be ingested, 2 for configuration. The corpus and a report
are written under ``$MEMREADER_HOME/runs/<run>/ingest/``. Details: docs/INGEST.md.
"""

from __future__ import annotations

import glob
import json
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import starmap
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from memreader.core.config import field
from memreader.core.corpus import CorpusError, read_corpus
from memreader.core.errors import ConfigError, RunFailed
from memreader.core.hardware import cpu_cores
from memreader.core.paths import run_dir, sha256_file, write_json, write_jsonl, write_resolved_config
from memreader.core.stage import Flag, Stage
from memreader.ingest.formats import FORMATS, FileProblem, extract, format_of


@dataclass
class IngestConfig:
    """Settings of ``memreader ingest``."""

    inputs: list[str] = field([], help="files, folders (searched recursively) and globs to ingest")
    run: str = field("ingest", help="run name: the corpus goes to $MEMREADER_HOME/runs/<run>/ingest/corpus.jsonl")
    workers: int = field(0, ge=0, help="extraction processes (0 = one per core)")
    id_field: str = field("id", help="id field of JSONL / Parquet corpora passed through")
    text_field: str = field("text", help="text field of JSONL / Parquet corpora passed through")

    def problems(self) -> list[str]:
        if not self.inputs:
            return ["inputs: name at least one file, folder or glob (memreader ingest docs/ notes.md)"]
        missing = [i for i in self.inputs if not glob.has_magic(i) and not Path(i).exists()]
        return [f"inputs: {i!r} does not exist" for i in missing]


@dataclass(frozen=True)
class Source:
    """One file to ingest and the id it gets."""

    path: Path
    doc_id: str


def find_sources(inputs: list[str]) -> list[Source]:
    """Every file the inputs name, with its id; a folder is searched recursively (hidden files skipped)."""
    sources: dict[str, Source] = {}
    for item in inputs:
        if glob.has_magic(item):
            base = Path(item.split("*")[0].split("?")[0].split("[")[0] or ".")
            base = base if base.is_dir() else base.parent
            found = [(Path(p), base) for p in sorted(glob.glob(item, recursive=True)) if Path(p).is_file()]
        elif Path(item).is_dir():
            found = [(p, Path(item)) for p in sorted(Path(item).rglob("*")) if p.is_file()
                     and not any(part.startswith(".") for part in p.relative_to(item).parts)]
        else:
            found = [(Path(item), Path(item).parent)]
        for path, base in found:
            doc_id = path.resolve().relative_to(base.resolve()).as_posix()
            other = sources.get(doc_id)
            if other is not None and other.path.resolve() != path.resolve():
                raise ConfigError(f"two files map to the id {doc_id!r}: {other.path} and {path}",
                                  "ingest them from one common folder, or rename one")
            sources[doc_id] = Source(path, doc_id)
    return list(sources.values())


def _extract_one(source: Source, sha256: str) -> list[dict[str, Any]] | dict[str, str]:
    """The record of one file (a worker process), or ``{"kind", "error"}`` when it gives no text."""
    try:
        got = extract(source.path)
    except FileProblem as exc:
        return {"kind": exc.kind, "error": str(exc)}
    if not got.text.strip():
        return {"kind": "no-text", "error": "the file holds no text — fix: check the file"}
    record: dict[str, Any] = {"id": source.doc_id, "text": got.text, "source": str(source.path.resolve()),
                              "sha256": sha256, "format": format_of(source.path)}
    if got.pages is not None:
        record["pages"] = [list(p) for p in got.pages]
    if got.headings is not None:
        record["headings"] = [[o, h] for o, h in got.headings]
    return [record]


def _passthrough(source: Source, sha256: str, cfg: IngestConfig) -> list[dict[str, Any]] | dict[str, str]:
    """The records of a JSONL or Parquet corpus, each with ``source`` and ``format`` added."""
    kind = format_of(source.path)
    if kind == "jsonl":
        try:
            rows = [{cfg.id_field: d.doc_id, cfg.text_field: d.text, **d.meta}
                    for d in read_corpus(source.path, cfg.id_field, cfg.text_field)]
        except CorpusError as exc:
            return {"kind": "corrupt", "error": str(exc)}
    else:
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(source.path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types; reported for this file, named
            return {"kind": "corrupt", "error": f"not a readable Parquet file ({type(exc).__name__}: {exc})"}
        if rows and (cfg.id_field not in rows[0] or cfg.text_field not in rows[0]):
            return {"kind": "corrupt", "error": f"no {cfg.id_field!r} / {cfg.text_field!r} columns — fix: set "
                    "id_field / text_field to its column names"}
    return [{**r, "id": str(r[cfg.id_field]), "text": r[cfg.text_field], "source": str(source.path.resolve()),
             "sha256": sha256, "format": kind} for r in rows]


def ingest(cfg: IngestConfig, progress: bool = True) -> dict[str, Any]:
    """Build (or update) the corpus of ``cfg``; returns the summary written beside it."""
    started = time.perf_counter()
    out_dir = run_dir(cfg.run, "ingest")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_resolved_config(out_dir, cfg)
    corpus_path = out_dir / "corpus.jsonl"
    previous = _previous_records(corpus_path)
    sources = find_sources(cfg.inputs)
    fates: dict[str, dict[str, Any]] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    todo: list[tuple[Source, str]] = []
    for source in sources:
        if format_of(source.path) is None:  # named like every file left out, not only counted
            error = (f"unsupported file type {source.path.suffix or '(none)'!r} — fix: supported: "
                     f"{', '.join(sorted(FORMATS))}")
            fates[source.doc_id] = {"fate": "unsupported", "error": error}
            print(f"ingest: {source.path}: {error}")
            continue
        sha = sha256_file(source.path)
        old = previous.get(str(source.path.resolve()))
        if old and all(r.get("sha256") == sha for r in old):
            records[source.doc_id] = old
            fates[source.doc_id] = {"fate": "unchanged"}
        else:
            todo.append((source, sha))
    results = {s.doc_id: _passthrough(s, h, cfg) for s, h in todo if format_of(s.path) in ("jsonl", "parquet")}
    results.update(_extract_files([(s, h) for s, h in todo if s.doc_id not in results], cfg.workers, progress))
    for source, _ in todo:
        result = results[source.doc_id]
        if isinstance(result, dict):
            fates[source.doc_id] = {"fate": result["kind"], "error": result["error"]}
            print(f"ingest: {source.path}: {result['error']}")
        else:
            records[source.doc_id] = result
            fates[source.doc_id] = {"fate": "ingested" if str(source.path.resolve()) not in previous else "updated"}
    rows = _unique_rows(records)
    current = {str(s.path.resolve()) for s in sources}
    removed = sorted(src for src in previous if src not in current)
    counts = dict(Counter(fate["fate"] for fate in fates.values()))
    if rows:
        write_jsonl(corpus_path, rows)
    summary = {"corpus": str(corpus_path) if rows else None, "documents": len(rows), "n_files": len(sources),
               "counts": counts, "removed": removed, "seconds": round(time.perf_counter() - started, 2),
               "files": {s.doc_id: {"source": str(s.path), **fates[s.doc_id]} for s in sources}}
    write_json(out_dir / "report.json", summary)
    print(f"ingest: {len(sources)} file(s): " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + (f", {len(removed)} removed" if removed else "") + f"; {len(rows)} document(s) → {corpus_path} "
          f"({summary['seconds']:.1f} s)")
    if not rows:
        raise RunFailed(f"nothing could be ingested from {len(sources)} file(s)",
                        f"see the lines above and {out_dir / 'report.json'}; supported: {', '.join(sorted(FORMATS))}")
    return summary


def _previous_records(corpus_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The records of the corpus already there, by source file (empty when there is none)."""
    previous: dict[str, list[dict[str, Any]]] = {}
    if corpus_path.is_file():
        for line in corpus_path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            previous.setdefault(rec["source"], []).append(rec)
    return previous


def _extract_files(files: list[tuple[Source, str]], workers: int, progress: bool) -> dict[str, Any]:
    """Each file's records (or its error record), extracted in ``workers`` processes (0: one per core)."""
    workers = min(workers or cpu_cores(), len(files))
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else nullcontext() as pool:
        found = pool.map(_extract_one, *zip(*files, strict=True), chunksize=4) if pool else starmap(_extract_one, files)
        bar = tqdm(found, total=len(files), desc="ingest", unit="file", disable=not progress)
        return {source.doc_id: result for (source, _), result in zip(files, bar, strict=True)}


def _unique_rows(records: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The corpus rows in document order; two records with one id are an error naming both sources."""
    seen: dict[str, str] = {}
    rows = []
    for doc_id in sorted(records):
        for rec in records[doc_id]:
            if rec["id"] in seen:
                raise ConfigError(f"the id {rec['id']!r} comes from {seen[rec['id']]} and from {rec['source']}",
                                  "give the records unique ids, or ingest the files separately")
            seen[rec["id"]] = rec["source"]
            rows.append(rec)
    return rows


STAGE = Stage("ingest", "PDF, Word, HTML, Markdown and text files into a reading corpus with pages and headings",
              run=ingest, config=IngestConfig, example_dir="configs/ingest/",
              flags=(Flag("inputs", positional=True, many=True, help="files, folders and globs"),
                     Flag("workers", int)))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("ingest"))
