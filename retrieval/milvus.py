"""Milvus by URI: a Milvus Lite file or a Milvus server, opened the same way by every store.

``uri`` is a path ending in ``.db`` (Milvus Lite, served from this process) or a server URI
(``http://``, ``https://``, ``tcp://``, ``unix:``). A server gets a token (``token``, else
``$MILVUS_TOKEN``) and a short connect timeout, so a wrong address fails in seconds with a message
naming it; a Lite file that another process holds is refused with the fix. The memory index, the
passage store (MeVe) and the conversation store all connect through :func:`connect`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pymilvus import MilvusClient
from pymilvus.exceptions import ConnectionConfigException, MilvusException

from retrieval.rows import MemoryIndexError

__all__ = ["CONNECT_TIMEOUT", "TOKEN_ENV", "connect", "disconnect", "is_server_uri", "resolve_token", "resolve_uri",
           "get_rows", "string_literal"]

CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a Milvus server to answer before failing (pymilvus alone waits 10)."""
TOKEN_ENV = "MILVUS_TOKEN"
"""The environment variable holding a Milvus server token when none is passed."""
# Milvus Lite serves gRPC in-process with gRPC's default ping policy (at most one ping per 5 minutes
# without data), while pymilvus pings every 10 s: after an idle spell the server answers with a
# "too_many_pings" GOAWAY that gRPC logs at ERROR. Keepalive guards network paths a local server
# does not have, so it is off for Milvus Lite (servers keep pymilvus' setting, which they permit).
_LITE_GRPC_OPTIONS = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}
_SERVER_PREFIXES = ("http://", "https://", "tcp://", "unix:")
_lite_clients: dict[str, list[MilvusClient]] = {}  # the open clients of each Milvus Lite file in this process
_lite_lock = threading.Lock()


def is_server_uri(uri: str | Path) -> bool:
    """True for a Milvus server URI, False for a Milvus Lite file path."""
    return str(uri).startswith(_SERVER_PREFIXES)


def resolve_uri(uri: str | Path, must_exist: bool = False) -> str:
    """A URI MilvusClient accepts: server URIs as given, file paths absolute and ending in ``.db``."""
    if is_server_uri(uri):
        return str(uri)
    path = Path(uri).expanduser().resolve()
    if path.suffix != ".db":
        raise MemoryIndexError(
            f"index path {path} must end in .db (Milvus Lite files do), or be a server URI like "
            "http://localhost:19530"
        )
    if must_exist and not path.exists():  # Milvus Lite 3 stores a .db folder, older versions a file
        raise MemoryIndexError(f"index file {path} does not exist; run `memreader index` first to build it")
    return str(path)


def resolve_token(uri: str | Path, token: str = "") -> str:
    """The token for ``uri``: ``token``, else ``$MILVUS_TOKEN``, for a server; none for Milvus Lite."""
    if not is_server_uri(uri):
        return ""
    return token or os.environ.get(TOKEN_ENV, "")


def connect(uri: str | Path, token: str = "", timeout: float = CONNECT_TIMEOUT) -> MilvusClient:
    """A ``MilvusClient`` for ``uri`` (resolve it with :func:`resolve_uri` first), failing clearly.

    A server gets ``token`` (else ``$MILVUS_TOKEN``) and ``timeout`` seconds to answer; a Milvus
    Lite file is served from this process (one process per file at a time) until the last client
    :func:`connect` gave for it is closed with :func:`disconnect`.
    """
    uri = str(uri)
    if not is_server_uri(uri):
        try:
            client = MilvusClient(uri=uri, grpc_options=dict(_LITE_GRPC_OPTIONS))
            with _lite_lock:
                _lite_clients.setdefault(uri, []).append(client)
            return client
        except ConnectionConfigException as exc:
            raise MemoryIndexError(
                f"cannot open the Milvus Lite file {uri} ({exc.message}); Milvus Lite serves a file to one process "
                "at a time: close the other process using it (another `memreader index`/`ask`/`chat`, a notebook), "
                "use another .db path, or put the data on a Milvus server (db_path=http://host:19530)"
            ) from exc
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    try:
        return MilvusClient(uri=uri, token=resolve_token(uri, token), timeout=timeout)
    except MilvusException as exc:
        raise MemoryIndexError(
            f"cannot reach the Milvus server at {uri} within {timeout:g} s ({exc.message}); start the server "
            "(e.g. Milvus standalone in Docker), check the URI, port and token, or use a local .db file for "
            "Milvus Lite (db_path=path/to/memories.db)"
        ) from exc


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


def string_literal(value: str) -> str:
    # Milvus Lite has no filter templates; a double-quoted literal with \\ and \" escaped is safe.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def get_rows(client: MilvusClient, collection: str, pks: list[str], output_fields: list[str]) -> list[dict]:
    """Rows by string primary key. Not ``client.get``: pymilvus quotes string ids with ``'`` unescaped,
    so an id like ``chunk/0/Women's League`` breaks its filter; :func:`string_literal` escapes."""
    if not pks:
        return []
    ids = ", ".join(string_literal(pk) for pk in pks)
    return list(client.query(collection, filter=f"pk in [{ids}]", output_fields=output_fields))
