"""The three stores against a real Milvus standalone server (the ``milvus`` 2.3.5 package from PyPI, started
here on free ports): build, update with generations and prune, every search mode the server supports, MeVe,
a chat that carries on after the server restarts; hybrid search and BM25 refused before any work on a server without BM25
functions; the server killed mid-update; authorization with a token from the config or ``$MILVUS_TOKEN``."""

from __future__ import annotations

import io
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymilvus import MilvusClient

from memreader.cli import main
from memreader.core.config import load_config
from memreader.core.schema import write_memories
from memreader.retrieval.chat import ChatConfig, run_chat
from memreader.retrieval.conversation_store import ConversationStore, ConversationStoreError
from memreader.retrieval.index import MemoryIndex, MemoryIndexError
from memreader.retrieval.meve import MeVePipeline, MeVeSettings
from memreader.retrieval.milvus import TOKEN_ENV, version_tuple
from memreader.retrieval.passages import PassageStore, PassageStoreError
from tests.retrieval.milvus_server import ROOT_TOKEN, MilvusServer, server_command
from tests.retrieval.retrieval_samples import CORPUS, MEMORIES, QUESTION, TEA, VOLCANO
from tests.retrieval.test_chat import CONFIG as CHAT_CONFIG
from tests.retrieval.test_chat import overrides as chat_overrides
from tests.retrieval.test_index_updates import KILN, changed_volcano

pytestmark = [pytest.mark.integration, pytest.mark.heavy]
NAME = "minilm-l6"
DENSE = ("three_layer", "single", "chunk_only")
STRONG = 0  # pymilvus' ConsistencyLevel.Strong as describe_collection reports it
QUERIES = ["How do scientists monitor volcanoes to forecast an eruption?", "泡茶的水温应该是多少度？", "What seals a pot?"]

if server_command() is None:
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        pytest.fail("milvus-server is missing: `make setup` installs it (the dev extra's `milvus` package)",
                    pytrace=False)
    pytest.skip(f"the `milvus` package has wheels for Linux x86_64 only, not {platform.system()} "
                f"{platform.machine()}", allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusServer]:
    """One server for the module (its embedded etcd has fixed ports: one server per machine at a time); the
    tests run in file order, and the last ones kill it, restart it, and restart it with authorization."""
    srv = MilvusServer(tmp_path_factory.mktemp("milvus")).start()
    try:
        yield srv
    finally:
        srv.kill()  # its data is a temporary folder: no graceful stop (~20 s) needed


NEW = [changed_volcano(), TEA, KILN]  # the update: volcano changed, bread gone (pruned), tea unchanged, kiln new


def _answers(index: MemoryIndex, modes: tuple[str, ...] = DENSE) -> dict[str, list[list[tuple[str, int, str, float]]]]:
    return {mode: [[(h.doc_id, h.scenario, h.text, round(h.score, 6)) for h in index.search(q, top_k=5, mode=mode)]
                   for q in QUERIES] for mode in modes}


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> dict[str, Any]:
    """What Milvus Lite answers before and after the update (volcano changed, bread pruned, kiln added), and its
    row counts after: every server result must equal these."""
    with MemoryIndex(tmp_path_factory.mktemp("lite") / "lite.db") as index:
        index.build(MEMORIES, embedder, embedder_name=NAME, progress=False)
        before = _answers(index, ("three_layer",))
        index.build(NEW, embedder, embedder_name=NAME, replace=False, prune=True, progress=False)
        return {"before": before, "after": _answers(index), "counts": index.counts()}


def _pks(index: MemoryIndex) -> list[str]:
    it = index._client.query_iterator(index.collection, batch_size=4096, output_fields=["pk"])
    try:
        pks = []
        while rows := it.next():
            pks += [r["pk"] for r in rows]
        return pks
    finally:
        it.close()


def test_the_memory_index_builds_updates_and_prunes_on_a_server_and_answers_as_milvus_lite(
        server: MilvusServer, lite: dict[str, Any], embedder: Any) -> None:
    with MemoryIndex(server.uri, "memories_update") as index:
        assert version_tuple(index.server_version)[:2] == (2, 3) and not index.server_has_bm25()
        first = index.build(MEMORIES, embedder, embedder_name=NAME, replace=False, progress=False)
        assert not first.update and index.meta["bm25"] is False  # recorded: this collection has no BM25 field
        assert index._client.describe_collection(index.collection)["consistency_level"] == STRONG
        kept = index.build(NEW, embedder, embedder_name=NAME, replace=False, progress=False)
        assert kept.plan.added == [KILN.doc_id] and kept.plan.replaced == [VOLCANO.doc_id]
        assert index.meta["generation"] == 2 and index.meta["bm25"] is False  # the update's record keeps it
        # Strong consistency: the search right after the update's commit sees the new version (the default,
        # Bounded, level may miss rows written moments before on a server)
        hit = index.search("What else sees the ground bulge?", top_k=1)[0]
        assert (hit.doc_id, hit.scenario) == (VOLCANO.doc_id, 2)
        pruned = index.build(NEW, embedder, embedder_name=NAME, replace=False, prune=True, progress=False)
        assert pruned.plan.removed == ["en-bread"] and pruned.scenarios == 0
        assert index.counts() == lite["counts"]
        pks = _pks(index)
        assert len(pks) == len(set(pks)) == sum(lite["counts"].values())
        assert _answers(index) == lite["after"]


@pytest.fixture(scope="module")
def cli_index(server: MilvusServer, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The index of :data:`MEMORIES` that `memreader index` builds on the server (collection ``cli``); the
    ``--set`` arguments that reach it."""
    memories = tmp_path_factory.mktemp("cli") / "memories.jsonl"
    write_memories(memories, MEMORIES)
    base = ["--set", f"db_path={server.uri}", "--set", "embedder=minilm-l6"]
    assert main(["index", *base, "--set", f"memories={memories}", "--set", "collection=cli"]) == 0
    return [*base, "--set", f"memories={memories}"]


def test_hybrid_modes_and_bm25_are_refused_before_any_work_naming_the_server_version(
        server: MilvusServer, cli_index: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    base = cli_index[:4]
    # `memreader index` with a hybrid mode: refused before anything is embedded or created
    assert main(["index", *cli_index, "--set", "collection=never_made", "--set", "mode=hybrid"]) == 2
    err = capsys.readouterr().err
    assert "search mode 'hybrid' needs BM25" in err and "v2.3.5" in err and "Milvus 2.5" in err
    assert "mode three_layer, single or chunk_only" in err and "Traceback" not in err
    client = MilvusClient(uri=server.uri)
    assert not client.has_collection("never_made")
    assert main(["ask", *base, "--set", "collection=cli", QUERIES[0]]) == 0  # three_layer; all dense modes: above
    assert "en-volcano" in capsys.readouterr().out.split("\n\n")[0]
    for mode in ("hybrid", "chunk_hybrid"):
        assert main(["ask", *base, "--set", "collection=cli", "--set", f"mode={mode}", QUESTION]) == 2
        err = capsys.readouterr().err
        assert f"search mode {mode!r} needs BM25" in err and "v2.3.5" in err and "Traceback" not in err
    # MeVe: its BM25 fallback is refused up front; without it MeVe runs on the server
    meve = [*base, "--set", "collection=cli", "--set", "pipeline=meve", "--set", "verifier_kind=embedding",
            "--set", "tau=0.2"]
    assert main(["ask", *meve, QUESTION]) == 2
    err = capsys.readouterr().err
    assert "MeVe's BM25 fallback (fallback=true) needs BM25" in err and "set fallback=false" in err
    assert main(["ask", *meve, "--set", "fallback=false", QUERIES[0]]) == 0
    assert "en-volcano" in capsys.readouterr().out
    with MemoryIndex.open(server.uri, "cli") as opened, pytest.raises(MemoryIndexError, match="v2.3.5"):
        opened.search_bm25(QUESTION, "chunk", 3)
    client.close()


def test_the_passage_store_and_meve_on_a_server_match_milvus_lite(server: MilvusServer, tmp_path: Path,
                                                                  embedder: Any, tokenizer: Any) -> None:
    settings = {"verify": False, "fallback": False, "t_max": 200, "k": 6}
    results = []
    for uri in (str(tmp_path / "passages.db"), server.uri):
        with PassageStore.create(uri, "passages", embedder=embedder) as store:
            assert store.build(CORPUS, embedder, embedder_name=NAME, batch_size=8, progress=False) == len(CORPUS)
            assert store._client.describe_collection("passages")["consistency_level"] == STRONG
            knn = [h.id for h in store.knn(store.embed_query(QUESTION), 5)]
            result = MeVePipeline(store, embedder, None, tokenizer, MeVeSettings(**settings)).run(QUESTION)
            results.append((knn, result.context, [c.id for c in result.passages]))
            if uri == server.uri:
                with pytest.raises(PassageStoreError, match=r"v2\.3\.5.*set fallback=false"):
                    store.bm25(QUESTION, 3)
                with pytest.raises(PassageStoreError, match="MeVe's fallback"):
                    MeVePipeline(store, embedder, None, tokenizer, MeVeSettings(verify=False, n_min=50)).run(QUESTION)
    assert results[0] == results[1]


def test_a_server_killed_mid_update_keeps_the_old_version_and_a_chat_and_the_rerun_carry_on(
        server: MilvusServer, lite: dict[str, Any], cli_index: list[str], embedder: Any, tiny_model: str,
        memreader_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One crash, two survivors: a chat's stored turns (it finished before the crash, with no goodbye after) and an
    index update the server died in (after its first write). After the restart the chat carries on and the index
    holds its old version, which the rerun updates."""
    sets = [*chat_overrides(tiny_model, "chat-server"), f"db_path={server.uri}", "collection=chat"]
    with pytest.raises(ConversationStoreError, match=r"BM25 signal \(bm25_weight > 0\).*v2\.3\.5.*bm25_weight=0"):
        run_chat(load_config(ChatConfig, CHAT_CONFIG, sets), stdin=io.StringIO("hello\n"), stdout=io.StringIO(),
                 stderr=io.StringIO())
    cfg = load_config(ChatConfig, CHAT_CONFIG, [*sets, "bm25_weight=0"])
    out = io.StringIO()
    assert run_chat(cfg, stdin=io.StringIO("My cat is called Pepper.\nWhat is my cat called?\n"), stdout=out,
                    stderr=io.StringIO()) == 0
    assert "conversation 'default' holds 4 turns (4 new)" in out.getvalue()

    with MemoryIndex(server.uri, "cli", embedder=embedder) as index:  # built from MEMORIES by `memreader index`
        inserts = 0
        real_insert = MemoryIndex._insert

        def insert_then_crash(self: MemoryIndex, rows: Any) -> None:  # the server dies after the update's first write
            nonlocal inserts
            real_insert(self, rows)
            inserts += 1
            server.kill()  # no goodbye: the chat's turns must have been made durable when they were stored

        monkeypatch.setattr(MemoryIndex, "_insert", insert_then_crash)
        started = time.perf_counter()
        with pytest.raises(MemoryIndexError) as err:
            index.build(NEW, embedder, embedder_name=NAME, replace=False, prune=True, progress=False)
        assert time.perf_counter() - started < 15 and inserts == 1
        assert f"lost the Milvus server at {server.uri}" in str(err.value) and "run the command again" in str(err.value)
        monkeypatch.setattr(MemoryIndex, "_insert", real_insert)
    server.restart()

    out = io.StringIO()
    assert run_chat(cfg, stdin=io.StringIO("/context\nAnd my car?\n"), stdout=out, stderr=io.StringIO()) == 0
    text = out.getvalue()
    assert "4 turns stored" in text and "(from the previous session)" in text
    assert "conversation 'default' holds 6 turns (2 new)" in text
    client = MilvusClient(uri=server.uri)
    assert client.describe_collection("chat")["consistency_level"] == STRONG
    client.close()
    # BM25 alone cannot be the only signal here: a store without embedders is refused before it is created
    with pytest.raises(ConversationStoreError, match=r"at least one embedder.*v2\.3\.5"):
        ConversationStore(server.uri, {}, collection="no_signal")

    with MemoryIndex.open(server.uri, "cli", embedder=embedder) as index:
        # the old version, searchable
        assert index.meta["generation"] == 1 and _answers(index, ("three_layer",)) == lite["before"]
        done = index.build(NEW, embedder, embedder_name=NAME, replace=False, prune=True, progress=False)
        assert done.plan.replaced == [VOLCANO.doc_id] and done.plan.removed == ["en-bread"]
        assert index.meta["generation"] == 2 and index.counts() == lite["counts"]
        pks = _pks(index)
        assert len(pks) == len(set(pks)) == sum(lite["counts"].values())  # nothing twice, nothing lost
        assert _answers(index, ("three_layer",)) == {"three_layer": lite["after"]["three_layer"]}


def test_an_authorizing_server_takes_the_token_from_the_config_or_the_environment(
        server: MilvusServer, cli_index: list[str], embedder: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    server.kill()
    server.restart(auth=True)  # the same data, now behind authorization (the last test of the module)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for token, env, named in (("", None, "no token was given"), ("root:wrong", None, "config's token key"),
                              ("", "root:nope", f"${TOKEN_ENV}")):
        if env:
            monkeypatch.setenv(TOKEN_ENV, env)
        started = time.perf_counter()
        with pytest.raises(MemoryIndexError) as err:
            MemoryIndex(server.uri, "auth", token=token)
        assert time.perf_counter() - started < 5
        message = str(err.value)
        assert f"{server.uri} refused the connection: authentication failed" in message and named in message
        assert "--set token=" in message and TOKEN_ENV in message
    monkeypatch.delenv(TOKEN_ENV)
    ask = ["ask", "--set", f"db_path={server.uri}", "--set", "collection=cli", QUERIES[0]]
    assert main([*ask, "--set", f"token={ROOT_TOKEN}"]) == 0  # from the config
    assert "en-volcano" in capsys.readouterr().out
    monkeypatch.setenv(TOKEN_ENV, ROOT_TOKEN)  # from the environment
    with MemoryIndex.open(server.uri, "cli", embedder=embedder) as index:
        assert index.search(QUERIES[0], top_k=1)[0].doc_id == VOLCANO.doc_id
    monkeypatch.setenv(TOKEN_ENV, "root:nope")
    assert main(ask) == 2
    err = capsys.readouterr().err
    assert "authentication failed" in err and TOKEN_ENV in err and "Traceback" not in err
