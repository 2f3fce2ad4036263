"""Milvus by URI, and the collection type that every store builds on.

``uri`` is a ``.db`` path (Milvus Lite, served from this process) or a server URI, with a token (``token``, else
``$MILVUS_TOKEN``) and a short connect timeout. :class:`MilvusCollection` is the base of the memory index, the
passage store and the conversation store, with one error family, :class:`StoreError`. On a server older than 2.5
(no BM25) a store is built without BM25 and refuses what needs it (:meth:`MilvusCollection.require_bm25`).
Details: docs/RETRIEVAL.md (Where the index lives, One store base); server specifics: :mod:`.milvus_server`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import grpc
import numpy as np
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import ConnectionConfigException, MilvusException

from memreader.core.embedders import encode
from memreader.core.errors import MemReaderError
from memreader.retrieval.lexical import add_bm25, text_field_params
from memreader.retrieval.milvus_server import (
    ServerClient,
    drop_record,
    grpc_status,
    read_record,
    write_record,
)

__all__ = ["BM25_SINCE", "CONNECT_TIMEOUT", "MAX_LIMIT", "MAX_TEXT_BYTES", "TOKEN_ENV", "MilvusCollection", "StoreError",
           "connect", "disconnect", "is_server_uri", "resolve_token", "resolve_uri", "string_literal",
           "version_tuple"]

CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a Milvus server to answer before failing (pymilvus alone waits 10)."""
TOKEN_ENV = "MILVUS_TOKEN"
"""The environment variable holding a Milvus server token when none is passed."""
MAX_LIMIT = 16384
"""Milvus' largest search / query limit."""
MAX_TEXT_BYTES = 65535
"""Milvus' VARCHAR limit."""
_INSERT_ROWS = 512  # rows per insert call, well under the 64 MB gRPC message limit
# Milvus Lite serves gRPC in-process with gRPC's default ping policy (at most one ping per 5 minutes
# without data), while pymilvus pings every 10 s: after an idle spell the server answers with a
# "too_many_pings" GOAWAY that gRPC logs at ERROR. Keepalive guards network paths a local server does
# not have, so it is off for Milvus Lite (servers keep pymilvus' setting, which they permit).
_LITE_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}
_SERVER_PREFIXES = ("http://", "https://", "tcp://", "unix:")
BM25_SINCE = (2, 5)
"""The first Milvus release with BM25 functions (full-text search); Milvus Lite 3 has them."""
_lite_clients: dict[str, list[MilvusClient]] = {}  # the open clients of each Milvus Lite file in this process
_lite_lock = threading.Lock()
_C = TypeVar("_C", bound="MilvusCollection")
log = logging.getLogger(__name__)


class StoreError(MemReaderError, RuntimeError, ValueError):
    """A Milvus store cannot be reached, is missing, unfinished, foreign or of another schema version,
    or a request to it is invalid. Each store raises its own subclass (``MemoryIndexError``,
    ``PassageStoreError``, ``ConversationStoreError``). Before they shared this family the stores
    raised RuntimeErrors or ValueErrors, so it is both: every caller that caught either still does."""


def is_server_uri(uri: str | Path) -> bool:
    """True for a Milvus server URI, False for a Milvus Lite file path."""
    return str(uri).startswith(_SERVER_PREFIXES)


def resolve_uri(uri: str | Path, error: type[StoreError] = StoreError) -> str:
    """A URI MilvusClient accepts: server URIs as given, file paths absolute and ending in ``.db``."""
    if is_server_uri(uri):
        return str(uri)
    path = Path(uri).expanduser().resolve()
    if path.suffix != ".db":
        raise error(f"the store path {path} must end in .db (Milvus Lite files do), or be a server URI",
                    "use a path like path/to/memories.db or a URI like http://localhost:19530")
    return str(path)


def resolve_token(uri: str | Path, token: str = "") -> str:
    """The token for ``uri``: ``token``, else ``$MILVUS_TOKEN``, for a server; none for Milvus Lite."""
    if not is_server_uri(uri):
        return ""
    return token or os.environ.get(TOKEN_ENV, "")


def connect(uri: str | Path, token: str = "", timeout: float = CONNECT_TIMEOUT,
            error: type[StoreError] = StoreError) -> MilvusClient | ServerClient:
    """A ``MilvusClient`` for ``uri`` (resolve it with :func:`resolve_uri` first), failing clearly with ``error``.
    A Milvus Lite file is served from this process (one process per file at a time) until the last client
    :func:`connect` gave for it is closed with :func:`disconnect`."""
    uri = str(uri)
    if not is_server_uri(uri):
        try:
            client = MilvusClient(uri=uri, grpc_options=dict(_LITE_GRPC_OPTIONS))
            with _lite_lock:
                _lite_clients.setdefault(uri, []).append(client)
            return client
        except ConnectionConfigException as exc:
            raise error(f"cannot open the Milvus Lite file {uri} ({exc.message}); Milvus Lite serves a file to one "
                        "process at a time", "close the other process using it (another `memreader index`/`ask`/`chat`, "
                        "a notebook), use another .db path, or put the data on a Milvus server "
                        "(db_path=http://host:19530)") from exc
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    resolved = resolve_token(uri, token)
    try:
        client = MilvusClient(uri=uri, token=resolved, timeout=timeout)
        # pymilvus shares one connection per address and token, and a shared one is handed out without a call:
        # this call checks the token and that the server answers, every time
        return ServerClient(client, uri, error, version=client.get_server_version(timeout=timeout))
    except (MilvusException, grpc.RpcError) as exc:
        if grpc_status(exc) == "UNAUTHENTICATED":
            given = ("no token was given (token is empty and $MILVUS_TOKEN is unset)" if not resolved else
                     "the token from the config's token key" if token else f"the token from ${TOKEN_ENV}")
            raise error(
                f"the Milvus server at {uri} refused the connection: authentication failed, {given}",
                f"set token: user:password (or an API key) in the config (--set token=...), or export {TOKEN_ENV}; "
                "a new server's root user is root:Milvus until its password is changed") from exc
        raise error(f"cannot reach the Milvus server at {uri} within {timeout:g} s ({getattr(exc, 'message', exc)})",
                    "start the server (e.g. Milvus standalone in Docker), check the URI, port and token, or use a local "
                    ".db file for Milvus Lite (db_path=path/to/memories.db)") from exc


def disconnect(client: MilvusClient, uri: str | Path) -> None:
    """Close a client from :func:`connect`. Closing the last one of a Milvus Lite file also stops the
    file's in-process server (pymilvus leaves it running until the process exits), so that another
    process — ``memreader ask`` after a build in a notebook — can open the file. Closing a client
    twice is harmless: it never releases a file that another client still uses."""
    uri = str(uri)
    if is_server_uri(uri):
        client.close()
        return
    with _lite_lock:
        clients = _lite_clients.get(uri, [])
        if not any(c is client for c in clients):
            return
        client.close()
        clients[:] = [c for c in clients if c is not client]
        if clients:
            return
        del _lite_clients[uri]
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_server(uri)


def version_tuple(version: str) -> tuple[int, ...]:
    """``(2, 3, 5)`` from a server's ``v2.3.5-lite``; a version that does not parse is an error naming it."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if match is None:
        raise StoreError(f"cannot read the Milvus server version {version!r}", "report it: memreader expects vX.Y.Z")
    return tuple(int(g) for g in match.groups() if g is not None)


def string_literal(value: str) -> str:
    # Milvus Lite has no filter templates; a double-quoted literal with \\ and \" escaped is safe.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


class MilvusCollection:
    """One Milvus collection of a store, with the store's metadata in one collection property.

    A subclass sets ``KIND`` (its name in messages), ``META_KEY`` (the property holding the JSON
    record), ``VERSION`` and ``VERSION_FIELD`` (the schema version this code reads and the record's
    key for it), ``MISSING_FIX`` and ``REBUILD_FIX`` (the fix for a missing store, and for one of
    another version or whose build did not finish), ``BUILT`` (the record has a build ``status``) and
    ``error`` (its :class:`StoreError` subclass). Use as a context manager (or call :meth:`close`).
    """

    KIND: ClassVar[str]
    META_KEY: ClassVar[str]
    VERSION: ClassVar[int]
    ALSO_READS: ClassVar[tuple[int, ...]] = ()
    """Older schema versions this code still reads (a subclass then copes with what they lack)."""
    VERSION_FIELD: ClassVar[str] = "format"
    MISSING_FIX: ClassVar[str]
    REBUILD_FIX: ClassVar[str]
    BUILT: ClassVar[bool] = True
    error: ClassVar[type[StoreError]] = StoreError

    def __init__(self, uri: str | Path, collection: str, token: str = "", timeout: float = CONNECT_TIMEOUT,
                 must_exist: bool = False) -> None:
        self.uri = resolve_uri(uri, self.error)
        self.collection = collection
        if not is_server_uri(self.uri):
            if must_exist and not Path(self.uri).exists():  # Milvus Lite 3 stores a .db folder, older ones a file
                raise self.error(f"{self.KIND} {self.uri} does not exist", self.MISSING_FIX)
            Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
        self._client = connect(self.uri, token, timeout, self.error)
        self._meta: dict[str, Any] | None = None

    def close(self) -> None:
        """Close the client (the last one of a Milvus Lite file frees the file: :func:`disconnect`)."""
        disconnect(self._client, self.uri)

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _closing_on_error(self) -> Iterator[None]:
        """Close the store if the block fails: a half-opened store would keep its Milvus Lite file."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def load(self) -> None:
        """Check :attr:`meta`, then load the collection for searching (a reopened one starts out released)."""
        _ = self.meta
        self._client.load_collection(self.collection)

    def rows_where(self, field: str, values: Sequence[str], output_fields: Sequence[str], also: str = "",
                   limit: int = 16384) -> list[dict[str, Any]]:
        """Rows whose string ``field`` is one of ``values`` (escaped as :func:`string_literal`) and that meet the
        filter ``also``; more than ``limit`` rows is an error (never a silently shortened answer)."""
        if not values:
            return []
        where = f"{field} in [{', '.join(map(string_literal, values))}]" + (f" and {also}" if also else "")
        rows = list(self._client.query(self.collection, filter=where, output_fields=list(output_fields), limit=limit + 1))
        if len(rows) > limit:
            raise self.error(f"more than {limit} rows of {self._where()} have {field} in {list(values)[:3]}",
                             "ask for fewer values at a time")
        return rows

    def rows_by_pk(self, pks: Sequence[str], output_fields: Sequence[str]) -> list[dict[str, Any]]:
        """Rows by string primary key. Not ``client.get``: pymilvus quotes string ids with ``'`` unescaped,
        so an id like ``chunk/0/Women's League`` breaks its filter; :func:`string_literal` escapes."""
        if not pks:
            return []
        ids = ", ".join(string_literal(pk) for pk in pks)
        return list(self._client.query(self.collection, filter=f"pk in [{ids}]", output_fields=list(output_fields)))

    def stored_vectors(self, ids: Iterable[str], fix: str) -> dict[str, np.ndarray]:
        """The stored unit ``vector`` (float32) of each primary key in ``ids``; an id without a row is an error."""
        ids = list(dict.fromkeys(ids))
        rows = self.rows_by_pk(ids, ["pk", "vector"])
        found = {r["pk"]: np.asarray(r["vector"], dtype=np.float32) for r in rows}
        missing = [i for i in ids if i not in found]
        if missing:
            raise self.error(f"{self._where()} has no row with primary key {missing[:3]}", fix)
        return found

    def _where(self) -> str:
        return f"{self.KIND} {self.uri} (collection {self.collection!r})"

    @property
    def meta(self) -> dict[str, Any]:
        """The store's metadata record, checked: made by memreader, of :attr:`VERSION`, and (for a
        ``BUILT`` store) with ``status`` complete."""
        if self._meta is None:
            if not self._client.has_collection(self.collection):
                raise self.error(f"{self.uri} has no collection {self.collection!r}", self.MISSING_FIX)
            record = self._read_record()
            if record is None:
                raise self.error(f"{self._where()} was not made by memreader (no {self.META_KEY} property)",
                                 "pick another collection name or db_path")
            meta = json.loads(record)
            found = meta.get(self.VERSION_FIELD)
            if found != self.VERSION and found not in self.ALSO_READS:
                raise self.error(f"{self._where()} has schema version {found!r}; this memreader reads version "
                                 f"{self.VERSION}", self.REBUILD_FIX)
            if self.BUILT and meta.get("status") != "complete":
                raise self.error(f"the last build of {self._where()} did not finish (status "
                                 f"{meta.get('status')!r})", self.REBUILD_FIX)
            self._meta = meta
        return self._meta

    @property
    def server_version(self) -> str:
        """The Milvus server's version as it reports it (``v2.3.5``), ``lite`` for a Milvus Lite file."""
        return self._client.version if isinstance(self._client, ServerClient) else "lite"

    def server_has_bm25(self) -> bool:
        """True where new collections can have BM25 functions: Milvus Lite, or a server of 2.5 or later."""
        return self.server_version == "lite" or version_tuple(self.server_version) >= BM25_SINCE

    def require_bm25(self, what: str, fix: str) -> None:
        """Refuse ``what`` (a search mode, a fallback, a signal) on a store without BM25 (for a collection not
        created yet: on a server that cannot give it one), naming the server version: called before any work is
        done. Every collection made before ``bm25`` was recorded has the field."""
        if self._meta is not None:
            has_bm25 = bool(self._meta.get("bm25", True))
        else:
            has_bm25 = self._stored_bm25() if self._client.has_collection(self.collection) else self.server_has_bm25()
        if not has_bm25:
            since = ".".join(map(str, BM25_SINCE))
            raise self.error(
                f"{what} needs BM25 full-text search, which {self._where()} does not have: the Milvus server is "
                f"version {self.server_version}, and BM25 functions came with Milvus {since}",
                f"{fix}; or use a Milvus {since}+ server or Milvus Lite (db_path=path/to/store.db) and rebuild")

    def _stored_bm25(self) -> bool:
        return bool(json.loads(self._read_record() or "{}").get("bm25", True))

    def _read_record(self) -> str | None:
        """The record's JSON text: on a server its row beside the collection
        (:mod:`memreader.retrieval.milvus_server`), else (and for stores made before it) the collection property."""
        if is_server_uri(self.uri):
            row = read_record(self._client, self.collection)
            if row is not None:
                return row
        return self._client.describe_collection(self.collection).get("properties", {}).get(self.META_KEY)

    def _write_meta(self, meta: dict[str, Any]) -> None:
        if "bm25" not in meta:  # the stores rebuild their record from their own keys: keep what the schema has
            meta = {**meta, "bm25": self._stored_bm25()}
        text = json.dumps(meta)
        self._client.alter_collection_properties(self.collection, properties={self.META_KEY: text})
        if is_server_uri(self.uri):  # a 2.3 server forgets altered properties when it restarts: the row is durable
            write_record(self._client, self.collection, text)
        self._meta = None

    def _flush(self) -> None:
        """Make the written rows durable: Milvus Lite writes its file on a flush. A server needs none (a write is
        durable once acknowledged: it is in the server's log, and survives a crash, as the tests check); there a
        flush only seals segments, which the server does itself, and costs about 2.4 s (Milvus 2.3.5)."""
        if not is_server_uri(self.uri):
            self._client.flush(self.collection)

    def _drop(self) -> None:
        """Drop the collection (and on a server its record collection)."""
        self._client.drop_collection(self.collection)
        if is_server_uri(self.uri):
            drop_record(self._client, self.collection)

    def _create(self, fields: Sequence[tuple[str, DataType, dict[str, Any]]], vectors: Mapping[str, int],
                language: str, meta: dict[str, Any]) -> None:
        """Create the collection with ``meta`` as its record: ``fields`` (``(name, type, params)``, the primary key
        first), ``text`` (BM25 in ``language``'s analyzer), one COSINE vector field per ``vectors`` name → dim."""
        bm25 = self.server_has_bm25()
        if not bm25 and not vectors:
            raise self.error(f"{self._where()} needs at least one embedder: the server (version "
                             f"{self.server_version}) has no BM25 functions, so nothing else could be searched",
                             "name an embedder, or use a Milvus 2.5+ server or Milvus Lite")
        if not bm25:
            log.warning("the Milvus server at %s is version %s, without BM25 functions (they came with %s): the %s is "
                        "built without its BM25 field, so hybrid search modes, MeVe's BM25 fallback and the chat's "
                        "BM25 signal will be refused on it", self.uri, self.server_version,
                        ".".join(map(str, BM25_SINCE)), self.KIND)
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        for name, dtype, params in fields:
            schema.add_field(name, dtype, **params)
        analyzer = text_field_params(language) if bm25 else {}  # a server without BM25 has no analyzers either
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES, **analyzer)
        index_params = self._client.prepare_index_params()
        for name, dim in vectors.items():
            schema.add_field(name, DataType.FLOAT_VECTOR, dim=dim)
            index_params.add_index(field_name=name, index_type="AUTOINDEX", metric_type="COSINE")
        if bm25:
            add_bm25(schema, index_params)
        # Strong consistency: on a server, a search with the default (Bounded) level may miss rows written
        # moments before (a 2.3.5 server returned nothing right after an insert); the stores search what they
        # have just written (an update's commit, a chat turn), so every read waits for all earlier writes.
        record = json.dumps({**meta, "bm25": bm25})
        self._client.create_collection(self.collection, schema=schema, consistency_level="Strong",
                                       properties={self.META_KEY: record})
        if is_server_uri(self.uri):
            write_record(self._client, self.collection, record)
        # Milvus Lite lacks the AllocTimestamp call that a synchronous index wait starts with (its
        # server logs a traceback, then pymilvus sleeps); its index is usable at once anyway.
        self._client.create_index(self.collection, index_params, sync=is_server_uri(self.uri))
        self._client.load_collection(self.collection)
        self._meta = None

    def _insert(self, rows: Sequence[dict[str, Any]]) -> None:
        for start in range(0, len(rows), _INSERT_ROWS):
            self._client.insert(self.collection, list(rows[start : start + _INSERT_ROWS]))

    def _finish(self, meta: dict[str, Any]) -> None:
        """Flush the rows, then record the build as complete."""
        self._flush()
        self._write_meta({**meta, "status": "complete"})

    def _count(self, filter: str = "") -> int:
        (row,) = self._client.query(self.collection, filter=filter, output_fields=["count(*)"])
        return int(row["count(*)"])

    def _check_query(self, query: str) -> None:
        if not isinstance(query, str) or not query.strip():
            raise self.error("the query is empty", "ask a question")

    def _check_limit(self, name: str, value: int) -> None:
        if not 1 <= value <= MAX_LIMIT:
            raise self.error(f"{name}={value} is out of range", f"use 1..{MAX_LIMIT}")

    def _check_embedder(self, asked: str | None, built: str) -> None:
        """Refuse to query with another embedder than the store was built with (when both are named)."""
        if asked and "unnamed" not in (asked, built) and asked != built:
            raise self.error(
                f"{self._where()} was built with {built!r}, not {asked!r}: vectors of different embedders are "
                "not comparable, even at the same dimension",
                f"query with embedder={built} or rebuild the {self.KIND} with embedder={asked}")

    def _encode_query(self, model: Any, query: str, dim: int, name: str) -> np.ndarray:
        """``query``'s unit vector from ``model``, which must give the ``dim`` of the stored ``name`` vectors."""
        self._check_query(query)
        if model is None:
            raise self.error("no embedder to encode the query", f"pass embedder= (the {self.KIND} holds {name!r} vectors)")
        vector = encode(model, [query], batch_size=1, kind="query")[0]
        if len(vector) != dim:
            raise self.error(f"the query embedder gives {len(vector)}-dim vectors but {self._where()} holds "
                             f"{dim}-dim {name!r} vectors", f"query with embedder={name}")
        return vector
