"""read-dist on a real multi-node Ray cluster, on this machine: ``ray.cluster_utils.Cluster`` starts a head node and a
second node, each with its own raylet, object store and worker processes (the head also runs the GCS), one CPU each,
so a pool of two one-CPU workers has one worker on each node. The driver joins the cluster by its address, as a user
on the head node would (``ray_address=<head>:<port>``).

- transformers workers (the tiny random model, guided): the merged memories equal the plain reader's, read on both
  nodes;
- the second node killed (its raylet and every process of it, as a lost machine) while its worker is in the middle
  of a shard: the shard is read again on the head node and merged once; the memories equal the plain reader's;
- vLLM's CPU build: two vLLM workers under Ray, one per node, and the ``vllm_dp`` engine (two engine processes),
  each equal to the plain vLLM reader (a tiny random Llama that vLLM's CPU attention takes);
- a worker that fits the cluster's total CPUs but no single node: an error after ``worker_start_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from memreader.core.errors import MemReaderError
from memreader.inference.distributed import DistributedReadConfig, read_distributed
from memreader.inference.ray_engine import START_TIMEOUTS
from tests.inference.test_distributed import READING, _corpus, _records, plain_records

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

# a node death is noticed by the head's health checks: ~10 s with Ray's defaults here, ~1 s with these
HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                 "health_check_failure_threshold": 2}
DOCS = 8  # two shards of four documents (two batches each), one per worker
PAUSE_ENV = "MEMREADER_TEST_PAUSE_ON_NODE"
# Put on the workers' PYTHONPATH as sitecustomize.py: the first worker on the named node to read a shard writes the
# flag file after the shard's first batch and waits there for its node to be killed.
PAUSE_HOOK = f'''
import importlib.abc, importlib.util, os, sys, time
from pathlib import Path

NODE, _, FLAG = os.environ.get("{PAUSE_ENV}", "").partition(":")


def pausing(read_shard):
    def read(cfg, shard, out_dir, backend, key):
        import ray

        flag = Path(FLAG)
        if ray.get_runtime_context().get_node_id() != NODE or flag.exists():
            return read_shard(cfg, shard, out_dir, backend, key)
        generate, calls = backend.generate_many, [0]

        def paused(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 2:
                flag.with_suffix(".tmp").write_text(f"{{os.getpid()}} {{shard.name}}")
                os.replace(flag.with_suffix(".tmp"), flag)
                time.sleep(120)
            return generate(*args, **kwargs)

        backend.generate_many = paused
        return read_shard(cfg, shard, out_dir, backend, key)

    return read


class Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "memreader.inference.shards":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.read_shard = pausing(module.read_shard)

        spec.loader.exec_module = exec_module
        return spec


if NODE:
    sys.meta_path.insert(0, Patch())
'''


START_TRIES = 2  # Ray gives each raylet a fixed 30 s to register; a loaded machine can miss that once (a clean-clone
# run of the suite did: "The current node timed out during startup"), as read-dist's own local start allows for


def _start_cluster() -> Any:
    """A head node and one more node, one CPU each (the head with fast health checks); a start that timed out is
    stopped (every process it started) and tried once more, saying so."""
    import psutil
    from ray.cluster_utils import Cluster

    for attempt in range(1, START_TRIES + 1):
        before = {c.pid for c in psutil.Process().children(recursive=True)}
        cluster = Cluster()
        try:
            cluster.add_node(num_cpus=1, include_dashboard=False, _system_config=HEALTH_CHECKS)  # the head
            cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            return cluster
        except Exception as exc:  # Ray raises a bare Exception for this timeout; anything else is re-raised
            if not any(timeout in str(exc) for timeout in START_TIMEOUTS) or attempt == START_TRIES:
                raise
            cluster.shutdown()
            started = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
            for child in started:
                with contextlib.suppress(psutil.NoSuchProcess):  # gone already: what this wants
                    child.kill()
            psutil.wait_procs(started, timeout=10)
            warnings.warn(f"the test cluster timed out during startup ({exc}); starting it again", stacklevel=1)
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head node and one more node, one CPU each (the head with fast health checks), shut down at module end."""
    import ray

    cluster = _start_cluster()
    try:
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def cluster(two_node_cluster):
    """The module's cluster with its second node: added again only for a test that comes after the node-killing
    one (which is last in this file, so in a plain run no node is started twice)."""
    if not two_node_cluster.worker_nodes:
        two_node_cluster.add_node(num_cpus=1)
        two_node_cluster.wait_for_nodes()
    return two_node_cluster


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("cluster_corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def plain(corpus, tiny_model, tmp_path_factory) -> list[dict]:
    """The plain reader's memories of the first DOCS documents (the read test_distributed.py makes, shared)."""
    return plain_records(corpus, tiny_model, tmp_path_factory)[:DOCS]


def _cfg(corpus: Path, cluster, model: str, **kw) -> DistributedReadConfig:
    base = {"input": str(corpus), "run": "cluster", "model": model, "limit": DOCS, "shard_size": 4, "num_workers": 2,
            "ray_address": cluster.address, "max_retries": 1, **READING}
    return DistributedReadConfig(**{**base, **kw})


def _node_ids(cluster) -> tuple[str, str]:
    """The head's node id and the other node's."""
    (other,) = cluster.worker_nodes
    return cluster.head_node.node_id, other.node_id


def test_reading_on_a_two_node_cluster_equals_the_plain_reader(tmp_path, monkeypatch, cluster, corpus, tiny_model,
                                                               plain) -> None:
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    summary = read_distributed(_cfg(corpus, cluster, tiny_model))
    assert (summary["shards"], summary["shards_read"], summary["read"], summary["redone"]) == (2, 2, DOCS, [])
    assert summary["nodes"] == sorted(_node_ids(cluster))  # one shard read on each node
    assert _records(summary["memories"]) == plain


def test_a_worker_no_node_has_room_for_is_named_after_worker_start_timeout_s(tmp_path, monkeypatch, cluster,
                                                                           corpus) -> None:
    """Two CPUs in the cluster, but one per node: a worker of two CPUs fits the totals and no node. Ray would wait
    for a node with room for ever; the run stops after worker_start_timeout_s naming it."""
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    t0 = time.perf_counter()
    with pytest.raises(MemReaderError) as info:
        read_distributed(_cfg(corpus, cluster, str(tmp_path), cpus_per_worker=2, num_workers=0,  # not loaded
                              worker_start_timeout_s=3))
    assert time.perf_counter() - t0 < 30
    message = str(info.value)
    assert "did not start 1 worker(s) of 2 CPU(s) and 0 GPU(s) within worker_start_timeout_s=3: not all of them " \
           "found a node with room" in message and "lower cpus_per_worker / gpus_per_worker to what one" in message


def test_vllm_workers_on_the_cluster_and_vllm_dp_equal_the_plain_vllm_reader(tmp_path, monkeypatch, cluster, corpus,
                                                                             tiny_vllm_model) -> None:
    """read-dist over vLLM engines (vLLM's CPU build, one in-process engine per worker), guided and greedy: Ray Data
    with one worker on each node of the cluster, and the data-parallel engine with two engine processes; both merged
    files equal the plain vLLM reader's record for record."""
    from memreader.core.vllm_engine import shutdown_engines
    from memreader.inference.reader import ReadConfig, read_corpus_memories

    reading = {**READING, "backend": "vllm", "dtype": "float32", "max_model_len": 1024,
               "kv_cache_gib": 0.25, "temperature": 0.0}
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # the engine below sets them: restored after the test
        if not os.environ[name]:
            monkeypatch.delenv(name)
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "plain"))
    try:
        plain = read_corpus_memories(ReadConfig(input=str(corpus), run="plain", model=tiny_vllm_model, limit=DOCS,
                                                **reading))
    finally:
        shutdown_engines()
    assert plain["read"] == plain["guided"] == DOCS and plain["engine"]["backend"] == "vllm"
    expected = _records(plain["memories"])
    for engine, extra in (("ray", {"gpus_per_worker": 0}), ("vllm_dp", {"data_parallel_size": 2})):
        monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / engine))
        summary = read_distributed(_cfg(corpus, cluster, tiny_vllm_model, engine=engine, **reading, **extra))
        assert (summary["read"], summary["shards_read"], summary["redone"]) == (DOCS, 2, []), engine
        assert summary["nodes"] == (sorted(_node_ids(cluster)) if engine == "ray" else [])
        assert _records(summary["memories"]) == expected, engine


def _kill_node_when_paused(cluster, node, flag: Path, done: threading.Event, out: dict) -> None:
    try:
        while not flag.exists():
            if done.wait(0.05):
                return
        out["pid"], out["shard"] = flag.read_text().split()
        cluster.remove_node(node, allow_graceful=False)  # the raylet and every other process of the node, SIGKILL
        out["killed"] = True
    except Exception as exc:  # raised by the test after the run
        out["error"] = exc


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_node_killed_mid_shard_has_its_shard_read_again_on_the_other_node(tmp_path, monkeypatch, capsys, cluster,
                                                                            corpus, tiny_model, plain) -> None:
    head, other = _node_ids(cluster)
    (node,) = cluster.worker_nodes
    hooks, flag = tmp_path / "hooks", tmp_path / "paused"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(PAUSE_HOOK, encoding="utf-8")
    monkeypatch.setenv(PAUSE_ENV, f"{other}:{flag}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hooks), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))]))
    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    done, killed = threading.Event(), {}
    killer = threading.Thread(target=_kill_node_when_paused, args=(cluster, node, flag, done, killed))
    killer.start()
    try:
        summary = read_distributed(_cfg(corpus, cluster, tiny_model))
    finally:
        done.set()
        killer.join()  # a test after this one gets its second node again from the `cluster` fixture
    assert "error" not in killed, killed.get("error")
    assert killed.get("killed"), "the worker on the second node never paused in a shard"
    assert _gone(int(killed["pid"]))  # the node's death took its worker: no writer left behind
    assert summary["redone"] == [killed["shard"]] and summary["read"] == DOCS and summary["shards_read"] == 2
    assert summary["nodes"] == [head]  # every merged shard was read on the surviving node
    out = Path(summary["memories"]).parent
    marker = json.loads((out / "shards" / f"{killed['shard']}.done.json").read_text(encoding="utf-8"))
    assert marker["pid"] != int(killed["pid"]) and marker["written"] == 4  # redone whole by the head's worker
    assert _records(summary["memories"]) == plain  # each document once, none lost
    assert not list((out / "shards").glob(".shard-*"))
    printed = capsys.readouterr().out
    assert f"WARNING: a worker died in the middle of {killed['shard']} (process killed, out of memory, or its Ray " \
           "node lost); read again from scratch by another worker and merged once" in printed
