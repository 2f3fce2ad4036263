"""What a Milvus *server* needs beyond Milvus Lite: errors that say the server was lost, and a store record
that survives the server's restart.

:class:`ServerClient` wraps a ``MilvusClient`` so that a lost connection raises the store's own error, naming the
URI and the fix. A Milvus 2.3 server forgets altered collection properties on restart, so on a server the store's
record is also the one row of ``<collection>__memreader``, and reading prefers it.
Measured behaviour: docs/RETRIEVAL.md (Against a real server: what was run, and what each failure looks like).
"""

from __future__ import annotations

import functools
from contextlib import suppress
from typing import Any

from pymilvus import DataType, MilvusClient
from pymilvus.client.types import Status
from pymilvus.exceptions import MilvusException

__all__ = ["RECORD_SUFFIX", "ServerClient", "drop_record", "grpc_status", "read_record", "write_record"]

RECORD_SUFFIX = "__memreader"
"""The record collection's name is the store's collection name + this."""
_RECORD_PK = "record"
_RECORD_BYTES = 65535


def grpc_status(exc: BaseException) -> str:
    """The gRPC status name behind a pymilvus error (``UNAUTHENTICATED``, ``UNAVAILABLE``), or ""."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        code = getattr(cause, "code", None)
        if callable(code):
            with suppress(TypeError, ValueError):  # pymilvus' own exceptions have no code() method
                return str(getattr(code(), "name", ""))
        cause = cause.__cause__ or cause.__context__
    return ""


def _lost(exc: MilvusException) -> bool:
    """True for a server that does not answer: pymilvus' failed (re)connection, or gRPC's unavailable / timed out."""
    status = grpc_status(exc)
    return status in ("UNAVAILABLE", "DEADLINE_EXCEEDED") or (
        exc.code == Status.CONNECT_FAILED and status != "UNAUTHENTICATED")


class ServerClient:
    """A ``MilvusClient`` of a Milvus server whose calls, when the server is lost (stopped, crashed,
    unreachable), raise ``error`` naming the URI and the fix instead of pymilvus' connection error. ``version`` is
    the server's, as it answered the connection's first call."""

    def __init__(self, client: MilvusClient, uri: str, error: type[Exception], version: str) -> None:
        self._client, self._uri, self._error, self.version = client, uri, error, version

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except MilvusException as exc:
                if not _lost(exc):
                    raise
                raise self._error(
                    f"lost the Milvus server at {self._uri} during {name} ({exc.message})",
                    "check that the server is running and reachable, then run the command again: an index update "
                    "that stopped half-way left the previous version searchable and starts over") from exc

        return call


def read_record(client: Any, collection: str) -> str | None:
    """The record row's JSON text beside ``collection``, or None where there is none."""
    name = collection + RECORD_SUFFIX
    if not client.has_collection(name):
        return None
    try:
        rows = client.query(name, filter=f'pk == "{_RECORD_PK}"', output_fields=["record"])
    except MilvusException as exc:
        if "not loaded" not in str(exc.message):
            raise
        client.load_collection(name)  # a restarted server starts with every collection released
        rows = client.query(name, filter=f'pk == "{_RECORD_PK}"', output_fields=["record"])
    return str(rows[0]["record"]) if rows else None


def write_record(client: Any, collection: str, text: str) -> None:
    """Make ``text`` the record beside ``collection`` (created and loaded on first use)."""
    if len(text.encode("utf-8")) > _RECORD_BYTES:
        raise ValueError(f"the store record of {collection!r} is {len(text.encode('utf-8'))} bytes; at most "
                         f"{_RECORD_BYTES} fit")
    name = collection + RECORD_SUFFIX
    if not client.has_collection(name):
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=16)
        schema.add_field("record", DataType.VARCHAR, max_length=_RECORD_BYTES)
        schema.add_field("v", DataType.FLOAT_VECTOR, dim=2)  # Milvus 2.3 needs a vector field in every collection
        index = client.prepare_index_params()
        index.add_index(field_name="v", index_type="FLAT", metric_type="L2")
        client.create_collection(name, schema=schema, consistency_level="Strong")
        client.create_index(name, index, sync=True)
        client.load_collection(name)
    client.upsert(name, [{"pk": _RECORD_PK, "record": text, "v": [1.0, 0.0]}])  # durable once acknowledged


def drop_record(client: Any, collection: str) -> None:
    """Drop the record collection beside ``collection`` (with the store it describes)."""
    name = collection + RECORD_SUFFIX
    if client.has_collection(name):
        client.drop_collection(name)
