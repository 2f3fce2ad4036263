"""`vllm serve` as a GPU user runs it (vLLM's CPU build here), read through the OpenAI-compatible path: a module of
its own (it shares no engine with test_vllm.py's in-process ones)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.inference.lora_adapters import random_lora_adapter

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

DEMO_CORPUS = Path(__file__).resolve().parents[2] / "memreader" / "demo_data" / "corpus.jsonl"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory, smollm2_path: str) -> str:
    return random_lora_adapter(smollm2_path, tmp_path_factory.mktemp("adapter"))[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_real_vllm_server_with_the_adapter_reads_guided_memories(tmp_path, adapter: str, smollm2_path: str) -> None:
    """`vllm serve` as a GPU user runs it (CPU build here): the adapter as a LoRA module, the guidance backend;
    `memreader read` on the OpenAI-compatible path sends each document's grammar in ``structured_outputs``. The
    server runs in the dtype `auto` picks on this CPU (bf16 only where its matmuls are the faster)."""
    from memreader.core.hardware import cpu_dtype

    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", smollm2_path,
           "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", cpu_dtype(),
           "--max-model-len", "4096", "--kv-cache-memory-bytes", str(2**30), "--enforce-eager",
           "--enable-lora", "--lora-modules", f"memreader={adapter}", "--max-lora-rank", "8",
           "--structured-outputs-config.backend", "guidance"]
    env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.time() + 300
        while True:
            assert server.poll() is None, f"vllm serve exited: {(tmp_path / 'server.log').read_text()[-3000:]}"
            try:
                models = json.load(urllib.request.urlopen(f"{url}/models", timeout=5))
                break
            except OSError:
                assert time.time() < deadline, "vllm serve did not come up in 300 s"
                time.sleep(0.5)
        served = {m["id"]: m for m in models["data"]}
        assert served["memreader"]["owned_by"] == "vllm" and "smollm2" in served
        from memreader.core.schema import read_memories
        from memreader.inference.reader import ReadConfig, read_corpus_memories

        cfg = ReadConfig(input=str(DEMO_CORPUS), limit=2, run="served", backend="openai", base_url=url,
                         model="memreader", guided="on", batch_size=2, request_timeout_s=600)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MEMREADER_HOME", str(tmp_path / "home"))
            mp.setenv("MEMREADER_READER_API_KEY", "unused")
            summary = read_corpus_memories(cfg)
        assert summary["read"] == 2 and summary["guided"] == 2 and summary["failed"] == {}
        for m in read_memories(summary["memories"]):
            assert "".join(m.chunks) == m.document and m.meta["generation"]["guided"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

