"""``memreader serve`` on the embedded SmolLM2, driven over real HTTP by OpenAIChat and urllib."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from memreader.cli import main
from memreader.core.generation import GenerationParams, GenerationRequestError, OpenAIChat
from memreader.core.registry import SMOLLM2
from memreader.inference.server import STAGE, ChatServer, ServeConfig, build_server

pytestmark = pytest.mark.integration
MODEL = SMOLLM2
CONFIGS = Path(__file__).resolve().parents[2] / "configs/inference"


def _serve(server: ChatServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def server(memreader_home: Path) -> Iterator[ChatServer]:
    srv = build_server(ServeConfig(MODEL, port=0, device="cpu", default_max_tokens=16))
    thread = _serve(srv)
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _http(url: str, body: bytes | dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) for a GET (body None) or POST; HTTP errors are returned, not raised."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_openai_teacher_through_the_server(server: ChatServer) -> None:
    teacher = OpenAIChat(MODEL, base_url=server.url, api_key="any", max_concurrency=2, timeout_s=120)
    prompts = ["Name one fruit.", "Say hello in French."]
    replies = teacher.generate_many([[{"role": "user", "content": p}] for p in prompts],
                                    GenerationParams(temperature=0, max_new_tokens=16))
    assert len(replies) == 2 and teacher.retries == 0
    for reply in replies:
        assert reply.strip()
        assert reply.prompt_tokens > 10  # the chat template adds a system prompt
        assert 0 < reply.completion_tokens <= 16
        assert reply.finish_reason in ("stop", "length")


def test_chat_completion_schema_and_usage(server: ChatServer) -> None:
    status, body = _http(f"{server.url}/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "seed": 7,
    })
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == MODEL and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    usage = body["usage"]
    assert 0 < usage["completion_tokens"] <= 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if usage["completion_tokens"] == 4:
        assert choice["finish_reason"] == "length"


def test_models_and_health(server: ChatServer) -> None:
    status, body = _http(f"{server.url}/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [MODEL]
    assert _http(server.url.replace("/v1", "/health"))[0] == 200


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({"model": MODEL}, 400, "'messages'"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, 400, "content must be a string"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 5}, 400, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}, 400, "stream"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 400, "cap of 4096"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 6000}], "max_tokens": 4096}, 400, "context"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, 404, MODEL),
])
def test_bad_requests_get_clear_json_errors(server: ChatServer, body: Any, status: int, needle: str) -> None:
    got, payload = _http(f"{server.url}/chat/completions", body)
    assert got == status
    assert needle in payload["error"]["message"]
    assert payload["error"]["type"] in ("invalid_request_error", "not_found_error")


def test_unknown_routes_are_404(server: ChatServer) -> None:
    assert _http(f"{server.url}/completions", {"prompt": "x"})[0] == 404
    assert _http(f"{server.url}/nothing")[0] == 404


def test_teacher_does_not_retry_a_wrong_model_name(server: ChatServer) -> None:
    teacher = OpenAIChat("no-such-model", base_url=server.url, api_key="any", backoff_base_s=0.01)
    with pytest.raises(GenerationRequestError, match=r"HTTP 404.*GET <base_url>/models"):
        teacher.generate_many([[{"role": "user", "content": "x"}]], GenerationParams(max_new_tokens=4))
    assert teacher.retries == 0


def test_serves_a_lora_adapter(memreader_home: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from memreader.core.runtime import load_causal_lm, runtime

    base, _ = load_causal_lm(MODEL, rt=runtime("cpu"))
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")
    srv = build_server(ServeConfig(MODEL, str(tmp_path / "adapter"), port=0, device="cpu"))
    thread = _serve(srv)
    try:
        assert [m["id"] for m in _http(f"{srv.url}/models")[1]["data"]] == [MODEL, "memreader"]
        status, body = _http(f"{srv.url}/chat/completions", {
            "model": "memreader", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
        })
        assert status == 200 and body["usage"]["completion_tokens"] > 0
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def test_cli_arguments(tmp_path: Path) -> None:
    """--config + --set like every stage; the earlier flags are shortcuts for the same keys (--set wins)."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}", encoding="utf-8")
    args = STAGE.parser().parse_args(["--config", str(CONFIGS / "serve_smollm2.yaml"), "--model", MODEL, "--adapter",
                              str(adapter), "--host", "0.0.0.0", "--port", "9000", "--set", "port=9001",
                              "--set", "max_tokens_cap=1024", "--api-key", "k"])
    cfg = STAGE.configure(args)
    assert (cfg.model, cfg.adapter, cfg.host, cfg.port) == (MODEL, str(adapter), "0.0.0.0", 9001)
    assert cfg.max_tokens_cap == 1024 and cfg.default_max_tokens == 512 and cfg.run == "serve-smollm2"
    assert args.api_key == "k" and not hasattr(cfg, "api_key"), "the key never lands in a config file"


def test_run_writes_the_resolved_config(memreader_home: Path, monkeypatch) -> None:
    """``memreader serve`` writes its resolved config once the server is up (here: stopped at once)."""
    import memreader.inference.server as server_module

    def stop_at_once(self, poll_interval: float = 0.5) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(server_module.ChatServer, "serve_forever", stop_at_once)
    assert main(["serve", "--set", f"model={MODEL}", "--set", "port=0", "--set", "device=cpu",
                 "--set", "run=serve-config-test", "--default-max-tokens", "8"]) == 0
    written = yaml.safe_load((memreader_home / "runs" / "serve-config-test" / "serve" / "config.yaml").read_text())
    assert written["model"] == MODEL and written["port"] == 0 and written["default_max_tokens"] == 8


def test_guided_reading_over_http_gives_exact_memories(server: ChatServer, tmp_path: Path, monkeypatch) -> None:
    """memreader read (backend=openai, guided=auto) against memreader serve: the client sees
    owned_by=memreader, sends each document's grammar, and every memory tiles its document."""
    from memreader.core.schema import read_memories
    from memreader.inference.reader import ReadConfig, read_corpus_memories

    monkeypatch.setenv("MEMREADER_HOME", str(tmp_path / "home"))
    path = tmp_path / "c.jsonl"
    text = ("The ferry leaves at seven every morning. In winter the first crossing is at eight. "
            "Bicycles travel free on weekdays. Dogs must stay on a lead on the upper deck.")
    path.write_text(json.dumps({"id": "ferry", "text": text}) + "\n")
    cfg = ReadConfig(input=str(path), run="http", backend="openai", model=MODEL, base_url=server.url,
                     max_new_tokens=300, min_chunk_chars=40, core_tokens=10, topic_tokens=8, temperature=0.1)
    summary = read_corpus_memories(cfg)
    assert summary["guided"] == 1 and summary["read"] == 1
    mem = read_memories(summary["memories"])[0]
    assert mem.meta["generation"]["guided"] and mem.meta["alignment"]["coverage_exact"] == 1.0
    assert len(mem.scenarios) >= 2 and "".join(mem.chunks) == text


def test_bad_grammar_is_a_400(server: ChatServer) -> None:
    status, body = _http(server.url + "/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "structured_outputs": {"grammar": "start: undefined_rule"}})
    assert status == 400 and "grammar" in body["error"]["message"]
    status, body = _http(server.url + "/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "structured_outputs": {"json": {}}})
    assert status == 400 and body["error"]["param"] == "structured_outputs"
