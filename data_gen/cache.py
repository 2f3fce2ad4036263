"""A crash-safe cache of teacher replies (SQLite, one row per call).

The key covers everything that changes a reply: the prompt template id (name, language, version),
the model, the sampling parameters and the exact messages (which contain the document, so its
hash is covered). A rerun repeats no call; Ctrl-C loses at most the calls still in flight.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any


def cache_key(template_id: str, model: str, params: dict[str, Any], messages: list[dict[str, str]]) -> str:
    """Stable hash of one teacher call."""
    blob = json.dumps(
        {"template": template_id, "model": model, "params": params, "messages": messages},
        ensure_ascii=False,
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ReplyCache:
    """Key → reply text, persisted after every insert."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> str | None:
        """The cached reply, or None."""
        row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return row[0]

    def put(self, key: str, reply: str) -> None:
        """Store one reply and commit at once."""
        self._db.execute("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)", (key, reply))
        self._db.commit()

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        """Close the database."""
        self._db.close()
