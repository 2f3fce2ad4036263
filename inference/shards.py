"""Shards of a corpus for distributed reading (:mod:`memreader.inference.distributed`): a deterministic plan
(:func:`plan_file_shards`: byte ranges of the corpus file with ids and text hashes, streamed, no text held), one
memories file and done-marker per shard (:func:`read_shard`, in an attempt folder renamed into place), and the merge
into one ``memories.jsonl``. Details (file layout, resuming, refusals): docs/DISTRIBUTED_READING.md (Files and resuming).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memreader.core.corpus import Document, record_document
from memreader.core.errors import MemReaderError
from memreader.core.paths import sha256_file, write_json
from memreader.core.schema import MemoryValidationError, iter_memories, write_memories

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"
PLAN_NAME = "plan.json"


class ShardError(MemReaderError, RuntimeError):
    """A shard could not be read, or the shards of a run do not fit together; the message names it."""


@dataclass(frozen=True)
class FileSpan:
    """Where a shard's documents sit in the corpus file: bytes ``[start, end)`` and the field names."""

    path: str
    start: int
    end: int
    id_field: str = "id"
    text_field: str = "text"


@dataclass
class Shard:
    """One contiguous slice of the corpus, in corpus order: its documents' ids and text hashes (``refs``), and
    either the documents themselves (``docs``) or the byte range of the corpus file that holds them (``span``)."""

    index: int
    docs: list[Document] | None = None
    refs: list[tuple[str, str]] | None = None
    span: FileSpan | None = None

    def __post_init__(self) -> None:
        if self.refs is None:
            if self.docs is None:
                raise ValueError("a shard needs its documents or their refs")
            self.refs = [(d.doc_id, d.sha256) for d in self.docs]

    @property
    def name(self) -> str:
        return f"shard-{self.index:05d}"

    @property
    def ids(self) -> list[str]:
        """The shard's doc_ids in corpus order."""
        return [doc_id for doc_id, _ in self.refs]

    def digest(self) -> str:
        """Hash of the shard's (doc_id, text sha256) list: a marker of other documents is never trusted."""
        blob = json.dumps([list(r) for r in self.refs])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def load(self) -> list[Document]:
        """The shard's documents: given, or read from its byte range of the corpus file (on the worker), each
        checked against the hash the driver planned with."""
        if self.docs is not None:
            return self.docs
        span = self.span
        path = Path(span.path)
        if not path.is_file():
            raise ShardError(f"{self.name}: the corpus {path} is not readable on {socket.gethostname()}",
                             "put the corpus on a filesystem every worker sees, or set send_text=true to ship each "
                             "shard's text from the driver")
        with path.open("rb") as fh:
            fh.seek(span.start)
            raw = fh.read(span.end - span.start)
        found = {}
        for chunk in raw.split(b"\n"):  # lines as the planner split them: on \n only (not U+2028 and kin)
            line = chunk.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                doc = record_document(rec, span.id_field, span.text_field)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line that no longer parses: its document is reported missing below
            found[doc.doc_id] = doc
        docs = []
        for doc_id, sha in self.refs:
            doc = found.get(doc_id)
            if doc is None or doc.sha256 != sha:
                raise ShardError(f"{self.name}: {path} changed since the run was planned ({doc_id!r} is "
                                 f"{'gone' if doc is None else 'another text'})",
                                 "rerun the same command: the plan is made again from the file as it is now")
            docs.append(doc)
        self.docs = docs
        return docs

    def payload(self) -> str:
        """What a worker needs, as JSON: the byte range and refs, or (no span, or ``with_text``) the documents."""
        if self.span is not None:
            return json.dumps({"span": asdict(self.span), "refs": self.refs})
        return json.dumps({"docs": [[d.doc_id, d.text, d.meta] for d in self.docs]}, ensure_ascii=False)

    def with_text(self) -> Shard:
        """The same shard carrying its documents (loaded here), so its payload needs no file on the worker."""
        return Shard(self.index, self.load(), self.refs)

    @classmethod
    def from_payload(cls, index: int, payload: str) -> Shard:
        data = json.loads(payload)
        if "span" in data:
            return cls(index, refs=[tuple(r) for r in data["refs"]], span=FileSpan(**data["span"]))
        return cls(index, [Document(doc_id, text, meta) for doc_id, text, meta in data["docs"]])


@dataclass
class FilePlan:
    """Shards of a corpus file, and what the scan found besides."""

    shards: list[Shard]
    documents: int
    """Documents with text (in the shards)."""
    empty: list[str]
    """ids of documents whose text is empty or only whitespace (in no shard)."""


def plan_file_shards(path: str | Path, shard_size: int, id_field: str = "id", text_field: str = "text",
                     limit: int | None = None) -> FilePlan:
    """Shards of ``shard_size`` non-empty documents of a JSONL corpus as byte ranges, from one streaming scan
    (:func:`memreader.core.corpus.iter_corpus_spans`: the same checks and errors as any corpus read); memory holds ids and hashes, never texts."""
    from memreader.core.corpus import iter_corpus_spans

    if shard_size < 1:
        raise ValueError(f"shard_size={shard_size} must be >= 1")
    path = Path(path)
    shards: list[Shard] = []
    refs: list[tuple[str, str]] = []
    empty: list[str] = []
    start = end = 0

    def close() -> None:
        shards.append(Shard(len(shards), refs=list(refs), span=FileSpan(str(path.resolve()), start, end, id_field,
                                                                          text_field)))
        refs.clear()

    for doc, line_start, line_end in iter_corpus_spans(path, id_field, text_field, limit):
        if not doc.text.strip():
            empty.append(doc.doc_id)
            continue
        if not refs:
            start = line_start
        refs.append((doc.doc_id, doc.sha256))
        end = line_end
        if len(refs) == shard_size:
            close()
    if refs:
        close()
    return FilePlan(shards, sum(len(s.refs) for s in shards), empty)


class ShardStore:
    """The shard files and markers of one run's ``read`` folder."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.dir = self.out_dir / SHARDS_DIR

    def path(self, shard: Shard) -> Path:
        return self.dir / f"{shard.name}.jsonl"

    def marker_path(self, shard: Shard) -> Path:
        return self.dir / f"{shard.name}.done.json"

    def marker(self, shard: Shard) -> dict[str, Any] | None:
        path = self.marker_path(shard)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:  # write_json renames a whole file into place: not a crash
            raise ShardError(f"{path} is not valid JSON ({exc.msg})",
                             f"delete it and {self.path(shard).name} to read that shard again") from None

    def state(self, shard: Shard, key: str) -> str:
        """``done`` (skip it), ``resume`` (finished, but some documents failed or were cut off: ask
        those again) or ``todo`` (no usable result: read it from scratch). A marker made from other
        documents or with other settings is refused, as the plain reader refuses to mix them."""
        marker = self.marker(shard)
        if marker is None:
            return "todo"
        if (marker.get("digest"), marker.get("read_key")) != (shard.digest(), key):
            raise ShardError(
                f"{self.marker_path(shard)} was read from other documents or with other settings (model, adapter "
                "weights, prompt, decoding, windows, or another shard_size); resuming would mix them",
                f"use a new run name, keep the earlier shard_size and settings, or delete {self.dir} to read "
                "everything again")
        path = self.path(shard)
        if not path.is_file() or sha256_file(path) != marker.get("sha256"):
            log.warning("%s: the shard file is missing or changed after it was finished; reading %s again",
                        path, shard.name)
            return "todo"
        return "resume" if marker.get("failed") or marker.get("truncated_skipped") else "done"

    def check_plan(self, shards: list[Shard], settings: dict[str, Any]) -> None:
        """Write the plan on the first run; on a rerun refuse a different sharding of the same run."""
        plan = {**settings, "shards": [{"index": s.index, "digest": s.digest(), "documents": len(s.refs),
                                        "first": s.ids[0], "last": s.ids[-1]} for s in shards]}
        path = self.dir / PLAN_NAME
        if path.is_file():
            before = json.loads(path.read_text(encoding="utf-8"))
            if before != plan:
                changed = sorted(k for k in set(before) | set(plan) if before.get(k) != plan.get(k))
                raise ShardError(
                    f"run folder {self.out_dir} was sharded differently before (changed: {', '.join(changed)}); "
                    "its finished shards would not line up with these",
                    f"rerun with the earlier corpus, limit and shard_size, use a new run name, or delete {self.dir} "
                    "to start over")
            return
        if (self.out_dir / "memories.jsonl").is_file():
            raise ShardError(f"{self.out_dir / 'memories.jsonl'} exists but was not made by distributed reading "
                             "(no shards/plan.json): merging would overwrite it",
                             "use a new run name (--set run=...), or resume it with `memreader read`")
        write_json(path, plan)

    def remove_attempts(self) -> list[Path]:
        """Remove attempt folders left by workers that died (call only while no worker runs)."""
        left = sorted(self.dir.glob(".shard-*.attempt-*")) if self.dir.is_dir() else []
        for path in left:
            shutil.rmtree(path)
        return left


def read_shard(cfg: Any, shard: Shard, out_dir: Path, backend: Any, key: str) -> dict[str, Any]:
    """Read one shard into its file and marker (see the module docstring); returns the marker.
    ``cfg`` is a :class:`memreader.inference.reader.ReadConfig`, ``key`` its :func:`memreader.inference.reader.read_key`."""
    from memreader.inference.reader import read_documents

    store = ShardStore(out_dir)
    state = store.state(shard, key)
    if state == "done":  # an earlier attempt finished it (e.g. its reply was lost with its worker)
        return {**store.marker(shard), "skipped": True}
    attempt = store.dir / f".{shard.name}.attempt-{uuid.uuid4().hex[:12]}"
    attempt.mkdir(parents=True)
    memories = attempt / "memories.jsonl"
    if state == "resume":  # keep what it has, ask only the failed / cut-off documents again
        shutil.copyfile(store.path(shard), memories)
    summary = read_documents(cfg, shard.load(), attempt, backend)
    if not memories.exists():
        write_memories(memories, [])
    os.replace(memories, store.path(shard))  # whole, or not at all
    marker = {"shard": shard.index, "digest": shard.digest(), "read_key": key, "documents": len(shard.refs),
              "written": sum(1 for _ in iter_memories(store.path(shard))), "sha256": sha256_file(store.path(shard)),
              "read": summary["read"], "failed": summary["failed"], "truncated_skipped": summary["truncated_skipped"],
              "resumed": state == "resume", "host": socket.gethostname(), "pid": os.getpid(),
              "summary": {**summary, "memories": str(store.path(shard))}}
    write_json(store.marker_path(shard), marker)
    shutil.rmtree(attempt)
    return {**marker, "skipped": False}


def merge_shards(store: ShardStore, shards: list[Shard], out_path: Path) -> int:
    """Write every shard's memories into ``out_path`` in corpus order (atomically); returns how many.
    A doc_id twice, or in a shard that does not hold it, is an error naming the document and files."""
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    seen: dict[str, str] = {}
    n = 0
    try:
        tmp.write_text("", encoding="utf-8")
        for shard in shards:
            path = store.path(shard)
            if not path.is_file():
                raise ShardError(f"{path} is missing while merging", "rerun the same command to read that shard")
            order = {doc_id: i for i, doc_id in enumerate(shard.ids)}
            mems = []
            for mem in iter_memories(path):
                if mem.doc_id in seen:
                    raise ShardError(f"doc_id {mem.doc_id!r} appears twice: in {seen[mem.doc_id]} and in {path}; "
                                     "a memories file holds each document once",
                                     f"delete {path.name} and its .done.json and rerun to read that shard again")
                if mem.doc_id not in order:
                    raise ShardError(f"{path} holds doc_id {mem.doc_id!r}, which is not a document of {shard.name}",
                                     f"delete {path.name} and its .done.json and rerun to read that shard again")
                seen[mem.doc_id] = str(path)
                mems.append(mem)
            mems.sort(key=lambda m: order[m.doc_id])  # a resumed shard appended its retried documents last
            n += write_memories(tmp, mems, append=True)
        os.replace(tmp, out_path)
    except (ShardError, MemoryValidationError):
        tmp.unlink(missing_ok=True)
        raise
    return n
