"""An index that follows its memories: which documents an update adds, replaces, keeps, removes.

    existing = indexed_versions(client, collection, committed)     # doc_id -> content hashes in the index
    plan = UpdatePlan.between(existing, {doc_id: memory_hash(m) for m in memories}, prune=True)

Documents compare by content hash (:func:`memreader.retrieval.rows.memory_hash`); new rows go under the next
generation, and :func:`newest_only` keeps readers on one version of each document until old rows are deleted.
Details (the four outcomes, what readers see meanwhile, BM25 drift): docs/RETRIEVAL.md (An index that follows
its memories).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from memreader.core.fusion import SINGLE, LayerHit, rank_hits
from memreader.retrieval.milvus import string_literal

__all__ = ["UpdatePlan", "delete_docs", "delete_other_versions", "indexed_versions", "newest_only"]

_DELETE_IDS = 256  # doc ids per delete filter
_QUERY_BATCH = 4096


@dataclass
class UpdatePlan:
    """What one update does, by document id (every list sorted)."""

    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    """In the index, not in the memories, and deleted (``prune``)."""
    stale: list[str] = field(default_factory=list)
    """In the index, not in the memories, and kept (no ``prune``)."""
    leftovers: dict[str, str] = field(default_factory=dict)
    """Unchanged documents that also hold rows of another version (an update that died between its commit and
    its deletions): doc id → the hash to keep; the other versions' rows are deleted."""

    @classmethod
    def between(cls, indexed: dict[str, set[str]], wanted: dict[str, str], prune: bool) -> UpdatePlan:
        """The plan that turns an index holding ``indexed`` (doc id → hashes) into one holding ``wanted``
        (doc id → hash)."""
        plan = cls()
        for doc_id, doc_hash in wanted.items():
            have = indexed.get(doc_id)
            if have and doc_hash in have:  # never written again: its rows' keys would collide with the new ones
                plan.unchanged.append(doc_id)
                if len(have) > 1:
                    plan.leftovers[doc_id] = doc_hash
            else:
                (plan.replaced if have else plan.added).append(doc_id)
        gone = sorted(set(indexed) - set(wanted))
        plan.removed, plan.stale = (gone, []) if prune else ([], gone)
        for name in ("added", "replaced", "unchanged"):
            getattr(plan, name).sort()
        return plan

    def counts(self) -> dict[str, int]:
        """How many documents each list holds."""
        return {k: len(v) for k, v in self.to_dict().items()}

    def to_dict(self) -> dict[str, list[str]]:
        """The lists by name (for the manifest)."""
        return {k: v for k, v in asdict(self).items() if k != "leftovers"}


def indexed_versions(client: Any, collection: str, committed: int) -> dict[str, set[str]]:
    """doc_id → the content hashes of its committed rows (two only after an update that stopped between its
    commit and its deletions). Read from the ``single`` rows: every indexed scenario has one."""
    out: dict[str, set[str]] = {}
    # Milvus Lite has no timestamp service: pymilvus warns on every iterator that it uses the client's clock.
    quiet = logging.getLogger("pymilvus.client.iterator.query_iterator")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        it = client.query_iterator(collection, batch_size=_QUERY_BATCH, output_fields=["doc_id", "doc_hash"],
                                   filter=f"layer == {string_literal(SINGLE)} and generation <= {int(committed)}")
    finally:
        quiet.setLevel(level)
    try:
        while rows := it.next():
            for row in rows:
                out.setdefault(row["doc_id"], set()).add(row["doc_hash"])
    finally:
        it.close()
    return out


def delete_other_versions(client: Any, collection: str, keep: dict[str, str]) -> int:
    """Delete the rows of each document in ``keep`` whose content hash is not the one to keep; returns how many."""
    return _delete(client, collection, sorted(keep.items()), lambda batch: " or ".join(
        f"(doc_id == {string_literal(d)} and doc_hash != {string_literal(h)})" for d, h in batch))


def delete_docs(client: Any, collection: str, doc_ids: Sequence[str], extra: str = "") -> int:
    """Delete every row of ``doc_ids`` (that also matches ``extra``, a filter expression), in batches; returns
    how many rows went."""
    return _delete(client, collection, doc_ids, lambda batch: f"doc_id in [{', '.join(map(string_literal, batch))}]"
                   + (f" and ({extra})" if extra else ""))


def _delete(client: Any, collection: str, items: Sequence[Any], where: Callable[[Sequence[Any]], str]) -> int:
    """Delete the rows matching ``where(batch)`` for each batch of ``items``; returns how many rows went."""
    deleted = 0
    for start in range(0, len(items), _DELETE_IDS):
        where_batch = where(items[start : start + _DELETE_IDS])
        (row,) = client.query(collection, filter=where_batch, output_fields=["count(*)"])
        deleted += int(row["count(*)"])
        client.delete(collection, filter=where_batch)
    return deleted


def newest_only(lists: Iterable[Sequence[LayerHit]]) -> list[list[LayerHit]]:
    """The lists with, per document, only the rows of the newest generation found in any of them, re-ranked.
    Outside the moment between an update's commit and its deletions every document has one generation, and
    the lists come back as they were."""
    lists = [list(hits) for hits in lists]
    newest: dict[str, int] = {}
    for hits in lists:
        for h in hits:
            newest[h.doc_id] = max(newest.get(h.doc_id, h.generation), h.generation)
    if all(h.generation == newest[h.doc_id] for hits in lists for h in hits):
        return lists
    return [rank_hits([h for h in hits if h.generation == newest[h.doc_id]], len(hits)) for hits in lists]
