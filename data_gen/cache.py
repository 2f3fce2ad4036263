"""A crash-safe cache of teacher replies (SQLite, one row per call): a rerun repeats no call, and a reply that was
cut off or could not become a memory is replayed unless ``retry_unusable``.
Details (what the key covers, what each row keeps): docs/ARCHITECTURE.md (Caching and resuming).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any


def cache_key(template_id: str, model: str, params: dict[str, Any], messages: list[dict[str, str]],
              backend: str = "", base_url: str = "", grammar: str | None = None, sample: int | None = None) -> str:
    """Stable hash of one teacher call; ``sample`` is the candidate index of multi-path sampling
    (left out of the key when None, so single-reply keys stay what they were)."""
    fields: dict[str, Any] = {
        "template": template_id, "model": model, "params": params, "messages": messages, "backend": backend,
        "base_url": base_url, "grammar_sha256": hashlib.sha256(grammar.encode()).hexdigest() if grammar else None}
    if sample is not None:
        fields["sample"] = sample
    blob = json.dumps(fields, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class _Table:
    """One table of the cache's SQLite file, created when missing; ``hits`` counts the rows found.

    WAL mode with ``synchronous=NORMAL``: every commit survives a crash of this process (the case that matters:
    Ctrl-C, OOM, a failing stage) without an fsync per reply, which would stall the event loop that keeps the
    teacher busy; only an OS crash or power cut can lose the last few commits."""

    def __init__(self, path: str | Path, table: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"CREATE TABLE IF NOT EXISTS {table}")
        self._db.commit()
        self.hits = 0

    def close(self) -> None:
        """Close the database."""
        self._db.close()


class ReplyCache(_Table):
    """Key → (reply text, how it was made, usable?), persisted after every insert."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(replies)")}
        if "info" not in columns:  # caches written before replies carried their metadata
            self._db.execute("ALTER TABLE replies ADD COLUMN info TEXT")
        if "usable" not in columns:
            self._db.execute("ALTER TABLE replies ADD COLUMN usable INTEGER")
        self._db.commit()
        self.reasked = 0

    def get(self, key: str, retry_unusable: bool = False) -> tuple[str, dict[str, Any]] | None:
        """The cached reply and its info, or None. With ``retry_unusable``, a reply that was cut off
        or marked unusable counts as missing (so it is asked again)."""
        row = self._db.execute("SELECT reply, info, usable FROM replies WHERE key = ?", (key,)).fetchone()
        if row is not None:
            info = json.loads(row[1]) if row[1] else {}
            unusable = row[2] == 0 or info.get("finish_reason") == "length"
            if not (retry_unusable and unusable):
                self.hits += 1
                return row[0], info
            self.reasked += 1
        return None

    def put(self, key: str, reply: str, info: dict[str, Any] | None = None) -> None:
        """Store one reply and commit at once."""
        self._db.execute("INSERT OR REPLACE INTO replies (key, reply, info, usable) VALUES (?, ?, ?, NULL)",
                         (key, reply, json.dumps(info or {}, sort_keys=True)))
        self._db.commit()

    def mark_unusable(self, key: str) -> None:
        """Remember that this reply could not become a memory (``retry_unusable`` asks again)."""
        self._db.execute("UPDATE replies SET usable = 0 WHERE key = ?", (key,))
        self._db.commit()

class ScoreCache(_Table):
    """Evaluator scores of candidate memories, one row per (memory, evaluator settings), committed at once (in the
    replies' SQLite file, its own table), so a resumed run rescores nothing."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "scores (key TEXT PRIMARY KEY, score TEXT NOT NULL)")

    @staticmethod
    def key(memory: Any, scorer: Any) -> str:
        """Hash of what a score depends on: the text, spans and cores, and the scorer's signature."""
        blob = json.dumps({"document": hashlib.sha256(memory.document.encode("utf-8")).hexdigest(),
                           "spans": [[s.start, s.end] for s in memory.scenarios], "cores": memory.cores,
                           "scorer": scorer.signature()}, ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored score, or None."""
        row = self._db.execute("SELECT score FROM scores WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, score: dict[str, Any]) -> None:
        """Store one score and commit at once."""
        self._db.execute("INSERT OR REPLACE INTO scores (key, score) VALUES (?, ?)", (key, json.dumps(score)))
        self._db.commit()
