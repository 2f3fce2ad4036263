"""MemReader from Python: files or texts to memories, an index over them, search in any mode, MeVe, scores.

    from memreader import api

    corpus = api.ingest(["reports/", "notes.md"], run="docs")        # PDF/DOCX/HTML/MD/TXT -> corpus.jsonl
    memories = api.read(corpus, run="docs")                          # guided memories that tile each document
    with api.index(memories, run="docs") as index:                   # three layers in Milvus Lite (updated in place)
        hits = index.search("What changed in the third quarter?", mode="hybrid")

Each function takes its command's settings as keyword arguments (over an optional ``config=`` YAML) and calls what
the command calls. Details and the full example (MeVe, audit page, view, score): docs/USAGE.md (the same from Python).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memreader.core.config import load_config
from memreader.core.errors import ConfigError
from memreader.core.paths import run_dir, write_jsonl
from memreader.core.schema import DocumentMemory, read_memories, write_memories

if TYPE_CHECKING:
    from memreader.core.fusion import Hit
    from memreader.eval.score import ScoreReport
    from memreader.retrieval.meve import MeVeResult
    from memreader.retrieval.rows import BuildSummary

__all__ = ["Index", "index", "ingest", "open_index", "read", "read_texts", "score", "view"]

C = TypeVar("C")


def _config(cls: type[C], config: str | Path | None, settings: Mapping[str, Any]) -> C:
    """``cls`` from a YAML file and keyword settings, checked exactly as the command checks them."""
    return load_config(cls, config, [f"{k}={json.dumps(v, default=str)}" for k, v in settings.items()])


def ingest(inputs: str | Path | Sequence[str | Path], run: str = "ingest", config: str | Path | None = None,
           progress: bool = False, **settings: Any) -> Path:
    """Files, folders and globs (PDF, DOCX, HTML, Markdown, text; JSONL/Parquet passed through) into a corpus
    with page and heading maps; returns ``runs/<run>/ingest/corpus.jsonl``. Unchanged files are skipped on a
    rerun; files that fail are named in ``report.json`` beside it (raises :class:`RunFailed` if none was ingested)."""
    from memreader.ingest.ingest import IngestConfig
    from memreader.ingest.ingest import ingest as run_ingest

    items = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    cfg = _config(IngestConfig, config, {"inputs": [str(i) for i in items], "run": run, **settings})
    summary = run_ingest(cfg, progress=progress)
    return Path(summary["corpus"])


def read(corpus: str | Path, run: str = "read", config: str | Path | None = None,
         **settings: Any) -> list[DocumentMemory]:
    """Read a corpus JSONL (from :func:`ingest`, or ``{"id", "text"}`` lines) into document memories with
    MemReader; resumes a run that stopped. ``settings`` are ``memreader read``'s keys (``model``, ``adapter``,
    ``backend``, ...). Returns every memory of ``runs/<run>/read/memories.jsonl``."""
    from memreader.inference.reader import ReadConfig, read_corpus_memories

    cfg = _config(ReadConfig, config, {"input": str(corpus), "run": run, **settings})
    summary = read_corpus_memories(cfg)
    return read_memories(summary["memories"])


def read_texts(texts: Mapping[str, str] | Sequence[str], run: str = "read", config: str | Path | None = None,
               **settings: Any) -> list[DocumentMemory]:
    """:func:`read` over texts given in Python (``{id: text}``, or a list whose ids are ``doc-0``, ``doc-1``...);
    they are written to ``runs/<run>/read/input.jsonl`` first, so the run resumes like any other."""
    items = dict(texts) if isinstance(texts, Mapping) else {f"doc-{i}": t for i, t in enumerate(texts)}
    if not items:
        raise ConfigError("read_texts: no texts given; pass {id: text} or a list of strings")
    bad = [k for k, v in items.items() if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"read_texts: the text of {bad[:3]} is not a string; pass str values")
    path = write_jsonl(run_dir(run, "read") / "input.jsonl", [{"id": str(k), "text": v} for k, v in items.items()])
    return read(path, run=run, config=config, **settings)


class Index:
    """An open MemReader index: :meth:`search` in any mode, :meth:`meve`; a context manager (or :meth:`close`)."""

    def __init__(self, cfg: Any, built: BuildSummary | None = None) -> None:
        from memreader.retrieval.search import Searcher

        self.config = cfg
        self.built = built
        """What :func:`index` wrote (documents added, replaced, unchanged, removed), when it built this index."""
        self._searcher = Searcher(cfg)

    def search(self, question: str, top_k: int | None = None, mode: str | None = None) -> list[Hit]:
        """The best chunks for ``question``: ``mode`` is ``three_layer`` (default), ``single``, ``chunk_only``,
        ``hybrid`` or ``chunk_hybrid``. Each hit has ``text`` (an exact span of its document), ``doc_id``,
        ``start``/``end``, ``score``, ``provenance`` (the layer rows that voted) and ``where`` (source, pages,
        headings)."""
        return self._searcher.ask(question, top_k, mode)

    def layer_texts(self, hits: Iterable[Hit]) -> dict[tuple[str, int], dict[str, str]]:
        """The outline item and core content of each hit's scenario, by ``(doc_id, scenario)``."""
        return self._searcher.index.layer_texts(hits)

    def meve(self, question: str) -> MeVeResult:
        """MeVe's verified, budgeted context for ``question`` (``.context``, ``.passages``, ``.audit``); its
        settings are this index's config keys (``k``, ``tau``, ``t_max``, ``verifier``...)."""
        return self._searcher.meve(question)

    def audit_page(self, question: str, result: MeVeResult | Sequence[Hit], path: str | Path) -> Path:
        """Write what :meth:`meve` or :meth:`search` returned for ``question`` as one offline HTML page (MeVe: every
        candidate of each phase, kept / dropped and why, the budget; layers: which layer found each hit), each hit
        shown inside its document; the page's path (``memreader ask --html``)."""
        from memreader.retrieval.audit_page import write_audit_page

        return write_audit_page(self._searcher.index, question, result, path, self.config.mode)

    def close(self) -> None:
        """Free the index (its Milvus Lite file is served from this process while open)."""
        self._searcher.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def index(memories: str | Path | Iterable[DocumentMemory], run: str = "read", config: str | Path | None = None,
          **settings: Any) -> Index:
    """Index memories (a memories JSONL, or :class:`DocumentMemory` objects) and return the open index.

    The index is updated in place by content hash (``replace=True`` rebuilds it; ``prune=True`` removes
    documents the memories no longer hold); ``settings`` are ``memreader index``'s keys (``db_path``,
    ``embedder``, ``mode``, ``top_k``...). Memory objects are written to ``runs/<run>/retrieval/memories.jsonl``
    first, so the index manifest names a file."""
    from memreader.retrieval.search import RetrievalConfig, run_index

    if not isinstance(memories, (str, Path)):
        path = run_dir(run, "retrieval") / "memories.jsonl"
        mems = list(memories)
        if not mems or not all(isinstance(m, DocumentMemory) for m in mems):
            raise ConfigError("index: give a memories JSONL path or a non-empty list of DocumentMemory objects")
        path.unlink(missing_ok=True)
        write_memories(path, mems)
        memories = path
    cfg = _config(RetrievalConfig, config, {"memories": str(memories), "run": run, **settings})
    return Index(cfg, run_index(cfg, progress=False))


def open_index(run: str = "read", config: str | Path | None = None, **settings: Any) -> Index:
    """Open the index a run (or ``db_path=``) already holds, for searching."""
    from memreader.retrieval.search import RetrievalConfig

    return Index(_config(RetrievalConfig, config, {"run": run, **settings}))


def score(predictions: Sequence[str], references: Sequence[str | Sequence[str]], profile: str = "mom",
          **overrides: Any) -> ScoreReport:
    """BLEU-1 / BLEU-avg / ROUGE-L / METEOR of answers against references (the papers' settings, ``profile``
    ``mom`` or ``crud``), with bootstrap intervals; ``report.metrics[name].value``, ``report.to_dict()``."""
    from memreader.eval.score import score_pairs

    return score_pairs(list(predictions), list(references), profile, **overrides)


def view(memories: str | Path, out: str | Path | None = None, candidates: str | Path | None = None,
         gold: str | Path | None = None) -> Path:
    """Write a memories file as one offline HTML page (``memreader view``; with ``memreader gen``'s candidates and a
    gold segmentation when given); the page's path."""
    from memreader.viewer.page import write_view

    return write_view(memories, out, candidates, gold).path
