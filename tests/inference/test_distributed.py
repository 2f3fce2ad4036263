"""Distributed reading: Ray Data on a local Ray instance and the one-node data-parallel engine, both
with the transformers reader on CPU (a tiny random model, guided, so every memory is real output).
The merged memories must equal the plain reader's; shards resume, dead workers are redone."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memreader.core.config import ConfigError, load_config
from memreader.core.corpus import CorpusError, read_corpus
from memreader.core.generation import GenerationRequestError
from memreader.core.markup import render_memory
from memreader.core.schema import read_memories, write_memories
from memreader.inference.distributed import DistributedReadConfig, read_distributed
from memreader.inference.ray_engine import RayUnreachable, join_ray, probe_address, start_local_ray
from memreader.inference.reader import ReadConfig, make_backend, read_corpus_memories, read_key
from memreader.inference.shards import Shard, ShardError, ShardStore, merge_shards, read_shard

TOPICS = ["compost", "bees", "rain", "bridges", "trains", "tea", "maps", "clocks"]
# the grammar and budget of test_reader's guided tiny-model test: three chunks, real (random) outline and cores
READING = {"backend": "transformers", "batch_size": 2, "max_new_tokens": 200, "min_chunk_chars": 60, "core_tokens": 12, "topic_tokens": 8}
TIMING = ("seconds", "elapsed_s", "latency_s")  # none of these is in a memory today; dropped if one appears


def plan_shards(docs: list, shard_size: int) -> list[Shard]:
    """Consecutive shards of ``shard_size`` documents held in memory (the plan read-dist makes from the file)."""
    return [Shard(i, docs[start:start + shard_size]) for i, start in enumerate(range(0, len(docs), shard_size))]


def _corpus(path: Path, n: int = 16) -> Path:
    lines = []
    for i in range(n):
        t = TOPICS[i % len(TOPICS)]
        text = (f"Document {i} is about {t}. The {t} club meets every week in the old hall. Members bring notes "
                f"about {t} and share them. Last year they wrote {i + 3} reports. Next spring the club plans a "
                f"trip to see more {t} in the valley.")
        lines.append(json.dumps({"id": f"doc-{i:02d}", "text": text}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _records(path: str | Path) -> list[dict]:
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMING}
        return [strip(v) for v in value] if isinstance(value, list) else value

    return [strip(m.to_dict()) for m in read_memories(path)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("dist_corpus") / "corpus.jsonl")


def plain_records(corpus: Path, model: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The plain reader's memories of ``corpus`` with READING: what every distributed run must reproduce. Read once
    per test session and corpus text (test_ray_cluster.py compares with the same read)."""
    import torch

    cache = tmp_path_factory.getbasetemp() / "plain_reads"
    cache.mkdir(exist_ok=True)
    cached = cache / f"{hashlib.sha256(corpus.read_bytes() + model.encode()).hexdigest()[:16]}.json"
    if cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8"))
    cfg = ReadConfig(input=str(corpus), run="plain", model=model, **READING)
    backend = make_backend(cfg)
    backend.model()
    threads = torch.get_num_threads()
    # one thread, as each worker below has (cpus_per_worker=1): on two shared cores torch's default of
    # every core made this guided read 20x slower (8 min instead of 23 s); the memories are the same
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MEMREADER_HOME", str(cached.with_suffix("")))
            summary = read_corpus_memories(cfg, backend=backend)
    finally:
        torch.set_num_threads(threads)
    assert summary["read"] == summary["guided"] and summary["fallback_whole_document"] == 0
    cached.write_text(json.dumps(_records(summary["memories"])), encoding="utf-8")
    return json.loads(cached.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def plain(corpus, tiny_model, tmp_path_factory) -> list[dict]:
    records = plain_records(corpus, tiny_model, tmp_path_factory)
    assert len(records) == 16
    return records


def _cfg(corpus: Path, model: str, **kw) -> DistributedReadConfig:
    base = {"input": str(corpus), "run": "dist", "model": model, "shard_size": 4, "num_workers": 2,
            "ray_num_cpus": 2, "data_parallel_size": 2, **READING}
    return DistributedReadConfig(**{**base, **kw})


def _shard_files(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((out / "shards").glob("shard-*"))}


@pytest.mark.heavy
@pytest.mark.integration
def test_ray_local_reading_equals_the_plain_reader_with_a_worker_dying_and_resumes_per_shard(
        tmp_path, monkeypatch, corpus, tiny_model, plain, die_in_shard) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    flag = tmp_path / "died"
    die_in_shard(1, flag)  # the worker reading shard 1 exits after its first batch
    cfg = _cfg(corpus, tiny_model, max_retries=1)
    summary = read_distributed(cfg)
    assert summary["shards"] == 4 and summary["shards_read"] == 4 and summary["read"] == 16
    assert flag.is_file(), "the test hook never killed a worker"
    out = Path(summary["memories"]).parent
    marker = ShardStore(out).marker(plan_shards(read_corpus(corpus), 4)[1])
    assert marker["pid"] != int(flag.read_text().split()[1]) and marker["written"] == 4  # redone by a new worker
    assert len(summary["workers"]) >= 2 and len(summary["nodes"]) == 1  # worker processes of one Ray node
    assert summary["redone"] == ["shard-00001"]  # named in a warning; its dead attempt's folder removed
    ids = [r["doc_id"] for r in _records(summary["memories"])]
    assert len(ids) == len(set(ids)) == 16
    assert _records(summary["memories"]) == plain  # same records, same order as `memreader read`
    die_in_shard(None)

    # a rerun finds every shard done: no Ray, no model, the merged file rewritten identically
    before = _shard_files(out)
    again = read_distributed(cfg)
    assert (again["shards_read"], again["shards_skipped"], again["read"], again["workers"]) == (0, 4, 0, [])
    assert _shard_files(out) == before and _records(again["memories"]) == plain
    # a driver killed in the middle of a shard, and its rerun: test_data_parallel_engine_gives_up_... (which shards
    # are left to read is decided before either engine starts, so that test covers both without a second Ray start)


@pytest.mark.heavy
@pytest.mark.integration
def test_data_parallel_engine_gives_up_naming_the_shard_and_a_rerun_finishes(tmp_path, monkeypatch, corpus,
                                                                            tiny_model, plain, die_in_shard) -> None:
    """engine=vllm_dp with the transformers backend: two CPU processes stand in for two GPUs. The rerun also finds
    the driver killed in the middle of shard 2 (half its file written, no marker, an attempt folder left): both
    shards are read again, shard 2 from scratch, and the finished ones are left as they were."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    flag = tmp_path / "died"
    die_in_shard(3, flag)
    cfg = _cfg(corpus, tiny_model, engine="vllm_dp", max_retries=0)
    with pytest.raises(ShardError, match=r"not finished: shard-00003; .*max_retries=0.*rerun the same command") as info:
        read_distributed(cfg)
    assert "finished shards are kept" in str(info.value) and flag.is_file()
    out = tmp_path / "home" / "runs" / "dist" / "read"
    done = {p.name for p in (out / "shards").glob("*.done.json")}
    assert "shard-00003.done.json" not in done and len(done) == 3  # the other process finished its shards
    assert not (out / "memories.jsonl").exists()  # nothing merged while a shard is missing
    die_in_shard(None)
    before = _shard_files(out)
    # the driver killed in the middle of shard 2: half its file written, no marker, an attempt folder left
    shard2 = out / "shards" / "shard-00002.jsonl"
    lines = shard2.read_text(encoding="utf-8").splitlines(keepends=True)
    shard2.write_text(lines[0] + lines[1][:50], encoding="utf-8")
    (out / "shards" / "shard-00002.done.json").unlink()
    (out / "shards" / ".shard-00002.attempt-dead").mkdir()
    summary = read_distributed(cfg)
    assert (summary["shards_read"], summary["shards_skipped"], summary["read"]) == (2, 2, 8)
    after = _shard_files(out)
    kept = ("00000", "00001")
    assert {k: v for k, v in after.items() if k.startswith(tuple(f"shard-{i}" for i in kept))} == \
        {k: v for k, v in before.items() if k.startswith(tuple(f"shard-{i}" for i in kept))}
    assert after["shard-00002.jsonl"] != before["shard-00002.jsonl"]  # redone from scratch, replaced whole
    assert [m.doc_id for m in read_memories(shard2)] == ["doc-08", "doc-09", "doc-10", "doc-11"]
    assert not list((out / "shards").glob(".shard-*")) and _records(summary["memories"]) == plain


CLUSTER = """
import sys, ray
ray.init(address="local", num_cpus=2, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # up until the test closes stdin
ray.shutdown()
"""


@pytest.mark.heavy
@pytest.mark.integration
@pytest.mark.slow  # starts a separate `ray start --head` cluster: ~1 min idle, ~4 min on a loaded 2-core machine
def test_joining_a_running_cluster_and_retries_used_up(tmp_path, monkeypatch, corpus, tiny_model, plain, die_in_shard) -> None:
    """A Ray cluster started by another process (as `ray start --head` would), joined by its address;
    a worker that dies with no retry left stops the run naming its shard, and a rerun finishes."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    # Ray 2.60: a cluster that ray.init() starts wants a token, and a driver given an address sends one only then
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    cluster = subprocess.Popen([sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    try:
        address = cluster.stdout.readline().strip()
        assert re.fullmatch(r"[\d.]+:\d+", address), address
        flag = tmp_path / "died"
        die_in_shard(1, flag)
        cfg = _cfg(corpus, tiny_model, ray_address=address, max_retries=0, limit=8)
        with pytest.raises(ShardError, match=r"shard\(s\) were not finished: (shard-00000, )?shard-00001; a worker "
                                             r"reading them died with no retry left \(max_retries=0; ActorDiedError"):
            read_distributed(cfg)
        assert flag.is_file()
        die_in_shard(None)
        summary = read_distributed(cfg)
        assert summary["shards"] == 2 and summary["read"] == 4 * summary["shards_read"]
        assert _records(summary["memories"]) == plain[:8]
        assert cluster.poll() is None  # the run disconnected; the cluster it joined still runs
    finally:
        cluster.stdin.close()
        cluster.wait(timeout=120)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1:{closed}", "nothing answers"), ("ray://127.0.0.1:{closed}", "nothing answers"),
    ("127.0.0.1:{silent}", "no answer within connect_timeout_s=3s"),  # takes connections, never speaks
    ("ray://127.0.0.1:{silent}", "no answer within connect_timeout_s=3s")])
def test_an_unreachable_ray_address_fails_fast_with_the_fix(tmp_path, monkeypatch, corpus, address, reason) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = address.format(closed=_closed_port(), silent=silent.getsockname()[1])
        t0 = time.perf_counter()
        with pytest.raises(RayUnreachable) as info:
            read_distributed(_cfg(corpus, str(tmp_path), ray_address=address, connect_timeout_s=3))  # never loaded
        assert time.perf_counter() - t0 < 8  # ray.init alone waits minutes, then exits the process
    message = str(info.value)
    assert f"no Ray cluster answers at ray_address={address!r} ({reason}" in message
    assert "ray start --head" in message and "leave ray_address empty" in message


def test_a_cluster_that_wants_a_token_is_named_at_once_with_the_fix(monkeypatch) -> None:
    """Ray 2.60 turns token authentication on for the clusters it starts; ray.init with a hand-given address sends
    no token unless RAY_AUTH_MODE=token, and is refused only after ~20 s of retries."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    class Refuse(grpc.GenericRpcHandler):  # answers every call as a token-auth GCS answers a driver without one
        def service(self, details):
            return grpc.unary_unary_rpc_method_handler(lambda request, context: context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing or incorrect"))

    server = grpc.server(ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((Refuse(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
            with pytest.raises(RayUnreachable) as info:
                probe_address(address, 3, "unused")
            assert f"ray_address={address!r} wants an authentication token (InvalidAuthToken" in str(info.value)
            assert "set RAY_AUTH_MODE=token here and give the cluster's token" in str(info.value)
            monkeypatch.setenv("RAY_AUTH_MODE", "token")
            probe_address(address, 3, "unused")  # ray.init will send the token: left to it
    finally:
        server.stop(None)


class _JoiningRay:
    """Stands in for the ``ray`` module: ``init`` raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def init(self, **kwargs) -> None:
        raise self.error


def test_a_refused_join_names_the_token_fix_only_for_a_token_refusal() -> None:
    refused = RuntimeError("Failed to connect to GCS. Last connection error: ray.exceptions.AuthenticationError: RPC "
                           "error: InvalidAuthToken: Authentication token is missing or incorrect.")
    error = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    error.__cause__ = refused
    with pytest.raises(RayUnreachable) as info:
        join_ray(_JoiningRay(error), "10.0.0.1:6379", {}, "the usual fix")
    assert "(the cluster refused this driver's authentication token)" in str(info.value)
    assert "RAY_AUTH_MODE=token" in str(info.value) and "the usual fix" not in str(info.value)
    with pytest.raises(RayUnreachable) as info:
        join_ray(_JoiningRay(ConnectionError("Failed to connect to Ray cluster")), "10.0.0.1:6379", {}, "the usual fix")
    assert "the usual fix" in str(info.value) and "RAY_AUTH_MODE" not in str(info.value)


class _StartingRay:
    """Stands in for the ``ray`` module: ``init`` raises the given errors in turn, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls, self.started = list(errors), [], []

    def init(self, **kwargs) -> None:
        self.calls.append("init")
        if self.errors:  # a failed start leaves its processes running, as Ray's GCS and raylet do
            self.started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
            raise self.errors.pop(0)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


TIMED_OUT = "The current node timed out during startup. This could happen because some of the raylet failed"


@pytest.mark.heavy
def test_a_local_ray_start_that_times_out_is_retried_once_then_named(caplog) -> None:
    cfg = DistributedReadConfig(ray_num_cpus=2)
    ray = _StartingRay(Exception(TIMED_OUT))
    start_local_ray(ray, cfg, {})  # Ray's fixed 30 s raylet wait missed once (a busy CI runner): a second start
    assert ray.calls == ["init", "shutdown", "init"]
    assert [p.poll() for p in ray.started] != [None]  # what the failed start left running was stopped
    assert "stopped 1 process(es) the failed Ray start left behind" in caplog.text
    assert "WARNING: the local Ray instance timed out during startup" in caplog.text and "try 2 of 2" in caplog.text

    ray = _StartingRay(Exception(TIMED_OUT), Exception(TIMED_OUT))
    with pytest.raises(RayUnreachable) as info:
        start_local_ray(ray, cfg, {})
    assert ray.calls == ["init", "shutdown", "init", "shutdown"]
    assert None not in [p.poll() for p in ray.started]  # nothing of a half-started node is left
    assert "the local Ray instance did not start" in str(info.value) and "tried 2 times" in str(info.value)
    assert "ray start --head" in str(info.value) and "finished shards are kept" in str(info.value)

    gcs = RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_abc")  # the GCS server's own
    ray = _StartingRay(gcs)  # wait, missed in a clean-clone run of the suite: retried the same way
    start_local_ray(ray, cfg, {})
    assert ray.calls == ["init", "shutdown", "init"]

    ray = _StartingRay(ValueError("num_cpus must be positive"))  # any other failure is not retried
    with pytest.raises(ValueError, match="num_cpus"):
        start_local_ray(ray, cfg, {})
    assert ray.calls == ["init"]


def test_duplicate_doc_ids_are_refused_before_any_work(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": f"text {n}"}) + "\n" for n, i in enumerate("abcb")))
    with pytest.raises(CorpusError, match=r"dup.jsonl:4: duplicate id 'b'"):
        read_distributed(_cfg(path, "org/unused-model"))
    assert not (tmp_path / "home" / "runs" / "dist" / "read" / "shards").exists()


@pytest.mark.integration
def test_merge_refuses_a_document_twice_naming_it(tmp_path, corpus, plain) -> None:
    from memreader.core.schema import DocumentMemory

    shards = plan_shards(read_corpus(corpus), 4)
    store = ShardStore(tmp_path)
    mems = [DocumentMemory.from_dict(r) for r in plain]
    for shard in shards:
        write_memories(store.path(shard), mems[shard.index * 4:(shard.index + 1) * 4])
    assert merge_shards(store, shards, tmp_path / "memories.jsonl") == 16
    assert _records(tmp_path / "memories.jsonl") == plain
    write_memories(store.path(shards[3]), [mems[5]], append=True)  # doc-05 again, in the wrong shard
    with pytest.raises(ShardError, match=r"doc_id 'doc-05' appears twice: in .*shard-00001.jsonl and in "
                                         r".*shard-00003.jsonl"):
        merge_shards(store, shards, tmp_path / "memories.jsonl")
    assert _records(tmp_path / "memories.jsonl") == plain  # the merged file was left as it was
    write_memories(store.path(shards[3]), mems[12:16])
    write_memories(store.path(shards[2]), [*mems[8:12], mems[0]])
    with pytest.raises(ShardError, match="doc_id 'doc-00' appears twice"):
        merge_shards(store, shards, tmp_path / "memories.jsonl")
    write_memories(store.path(shards[2]), mems[8:12])
    write_memories(store.path(shards[0]), [*mems[0:4], mems[4]])  # doc-04 belongs to shard 1
    with pytest.raises(ShardError, match=r"shard-00000.jsonl holds doc_id 'doc-04', which is not a document of "
                                         r"shard-00000"):
        merge_shards(store, shards, tmp_path / "memories.jsonl")


class Scripted:
    """A backend without a model: a two-chunk memory per document, or a failed request for ``fail``."""

    def __init__(self, fail: str = "") -> None:
        self.fail, self.seen = fail, []

    def generate_many(self, list_of_messages, params, progress_desc=None, on_reply=None, return_exceptions=False,
                      grammars=None):
        outs = []
        for msgs in list_of_messages:
            doc = msgs[-1]["content"].split("<document>\n", 1)[1].rsplit("\n</document>", 1)[0]
            self.seen.append(doc)
            cut = doc.index(" ", len(doc) // 2)
            outs.append(GenerationRequestError("HTTP 500 five times", 500) if self.fail and self.fail in doc
                        else render_memory(["x", "y"], [doc[:cut], doc[cut:]], ["c", "d"]))
        return outs


def test_a_shard_with_failed_documents_is_resumed_and_merged_in_corpus_order(tmp_path, corpus) -> None:
    cfg = ReadConfig(input=str(corpus), guided="off", batch_size=4)
    shard = plan_shards(read_corpus(corpus), 4)[1]  # doc-04 .. doc-07
    store, key = ShardStore(tmp_path), read_key(cfg)
    first = read_shard(cfg, shard, tmp_path, Scripted(fail="Document 5 "), key)
    assert first["written"] == 3 and list(first["failed"]) == ["doc-05"] and store.state(shard, key) == "resume"
    backend = Scripted()
    second = read_shard(cfg, shard, tmp_path, backend, key)
    assert len(backend.seen) == 1 and "Document 5 " in backend.seen[0]  # only the failed one is asked again
    assert second["resumed"] and second["written"] == 4 and second["failed"] == {}
    assert store.state(shard, key) == "done" and not list(store.dir.glob(".shard-*"))
    assert [m.doc_id for m in read_memories(store.path(shard))] == ["doc-04", "doc-05", "doc-06", "doc-07"]
    assert merge_shards(store, [shard], tmp_path / "m.jsonl") == 4
    assert [m.doc_id for m in read_memories(tmp_path / "m.jsonl")] == ["doc-04", "doc-05", "doc-06", "doc-07"]
    with pytest.raises(ShardError, match="other documents or with other settings"):
        store.state(shard, read_key(ReadConfig(input=str(corpus), guided="off", temperature=0.5)))


def test_runs_that_would_mix_are_refused(tmp_path, monkeypatch, corpus) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    out = tmp_path / "home" / "runs" / "dist" / "read"
    shards = plan_shards(read_corpus(corpus), 4)
    ShardStore(out).check_plan(shards, {"shard_size": 4, "documents": 16})
    with pytest.raises(ShardError, match=r"sharded differently before \(changed: shard_size, shards\)"):
        read_distributed(_cfg(corpus, "org/unused-model", shard_size=5))
    (out / "shards" / "plan.json").unlink()
    (out / "memories.jsonl").write_text("")
    with pytest.raises(ShardError, match="was not made by distributed reading"):
        read_distributed(_cfg(corpus, "org/unused-model"))


def test_config_problems_are_named(tmp_path, corpus) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(DistributedReadConfig, None, [f"input={corpus}", "engine=spark", "backend=openai",
                                                  "base_url=http://x/v1", "ray_address=head-node", "shard_size=0",
                                                  "gpus_per_worker=1.5"])
    message = str(info.value)
    for part in ("engine: 'spark' is not one of ray, vllm_dp", "backend: openai is one server",
                 "ray_address='head-node'", "shard_size=0 is out of range", "gpus_per_worker=1.5"):
        assert part in message
    cfg = load_config(DistributedReadConfig, None, [f"input={corpus}", "backend=vllm"])
    from memreader.core.vllm_engine import on_gpu

    # vLLM workers take a GPU each where there is one; vLLM's CPU build reads on CPU cores
    assert cfg.worker_gpus() == float(on_gpu())
    assert load_config(DistributedReadConfig, None, [f"input={corpus}", "backend=transformers"]).worker_gpus() == 0
