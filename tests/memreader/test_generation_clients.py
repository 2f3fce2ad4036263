"""Teacher clients: OpenAIChat against a scripted real HTTP server, LocalChat on the embedded model."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memreader.core.generation import (
    GenerationParams,
    GenerationRequestError,
    LocalChat,
    OpenAIChat,
    Reply,
    make_chat,
)
from memreader.core.generation.openai_chat import _retry_after

SECRET = "sk-test-SECRET-0123456789"


class FakeOpenAI(ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint whose answers are scripted per prompt and per attempt.

    ``plan[prompt]`` lists the actions for successive attempts ("429", "500", "slow", "400", "401",
    "think"); attempts past the end of the list succeed with ``echo:<prompt>``.
    """

    daemon_threads = True

    def __init__(self, plan: dict[str, list[str]], delay_s: float = 0.0, slow_s: float = 0.6,
                 retry_after: str = "0.25", owned_by: str = "openai") -> None:
        super().__init__(("127.0.0.1", 0), _FakeHandler)
        self.owned_by = owned_by
        self.bodies: list[dict[str, Any]] = []
        self.plan, self.delay_s, self.slow_s, self.retry_after = plan, delay_s, slow_s, retry_after
        self.attempts: Counter[str] = Counter()
        self.auth: set[str] = set()
        self.inflight = self.max_inflight = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _FakeHandler(BaseHTTPRequestHandler):
    server: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: the default handler prints every request to stderr."""

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and hung up: exactly what the "slow" action provokes

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._send(200, {"object": "list", "data": [
            {"id": "fake-model", "object": "model", "created": 0, "owned_by": self.server.owned_by}]})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        srv = self.server
        with srv.lock:
            srv.bodies.append(body)
            attempt = srv.attempts[prompt]
            srv.attempts[prompt] += 1
            srv.auth.add(self.headers.get("Authorization", ""))
            srv.inflight += 1
            srv.max_inflight = max(srv.max_inflight, srv.inflight)
        steps = srv.plan.get(prompt, [])
        action = steps[attempt] if attempt < len(steps) else "ok"
        try:
            self._act(action, prompt, body)
        finally:
            with srv.lock:
                srv.inflight -= 1

    def _act(self, action: str, prompt: str, body: dict[str, Any]) -> None:
        def error(status: int, message: str, headers: dict[str, str] | None = None) -> None:
            self._send(status, {"error": {"message": message, "type": "x", "param": None, "code": None}}, headers)

        if action == "429":
            error(429, "rate limited", {"Retry-After": self.server.retry_after})
        elif action == "500":
            error(500, "boom")
        elif action == "400":
            error(400, "messages: unsupported content")
        elif action == "401":  # some providers echo the key they were sent
            error(401, f"Incorrect API key provided: {self.headers.get('Authorization', '')}")
        else:
            time.sleep(self.server.slow_s if action == "slow" else self.server.delay_s)
            message: dict[str, Any] = {"role": "assistant", "content": f"echo:{prompt}"}
            if action == "think":
                message["reasoning_content"] = "let me think"
            self._send(200, {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
            })


@pytest.fixture
def fake() -> Iterator[Any]:
    """Start a FakeOpenAI with a given plan; every server started is shut down after the test."""
    servers: list[FakeOpenAI] = []

    def start(plan: dict[str, list[str]], **kw: Any) -> FakeOpenAI:
        server = FakeOpenAI(plan, **kw)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _teacher(url: str, **kw: Any) -> OpenAIChat:
    opts: dict[str, Any] = {"max_concurrency": 4, "max_retries": 3, "timeout_s": 0.3,
                            "backoff_base_s": 0.01, "backoff_max_s": 1.0}
    opts.update(kw)
    return OpenAIChat("fake-model", base_url=url, api_key=SECRET, **opts)


def _msgs(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt}]


PARAMS = GenerationParams(temperature=0.7, top_p=0.8, max_new_tokens=16, seed=1)


def test_retries_429_500_timeout_then_success_in_input_order(fake: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = fake({"a": ["429"], "b": ["500", "500"], "c": ["slow"], "d": []})
    teacher = _teacher(server.url)
    caplog.set_level(logging.WARNING, logger="memreader.core.generation.openai_chat")
    start = time.perf_counter()
    replies = teacher.generate_many([_msgs(p) for p in "abcd"], PARAMS)
    assert replies == ["echo:a", "echo:b", "echo:c", "echo:d"]
    assert server.attempts == {"a": 2, "b": 3, "c": 2, "d": 1}
    assert teacher.retries == 4
    assert server.auth == {f"Bearer {SECRET}"}
    # Retry-After (0.25 s) is honoured, not replaced by the tiny exponential backoff
    assert "(HTTP 429); retrying in 0.25 s" in caplog.text
    assert time.perf_counter() - start >= 0.25
    assert "APITimeoutError" in caplog.text
    first = replies[0]
    assert isinstance(first, Reply) and first.prompt_tokens == 7 and first.completion_tokens == 3
    assert first.finish_reason == "stop" and first.reasoning is None


def test_concurrency_never_exceeds_max(fake: Any) -> None:
    server = fake({}, delay_s=0.1)
    prompts = [f"p{i}" for i in range(12)]
    replies = _teacher(server.url, max_concurrency=3).generate_many([_msgs(p) for p in prompts], PARAMS)
    assert replies == [f"echo:{p}" for p in prompts]
    assert server.max_inflight == 3  # bounded, and actually concurrent


@pytest.mark.parametrize(("action", "status", "hint"), [("400", 400, "message format"),
                                                        ("401", 401, "MEMREADER_TEACHER_API_KEY")])
def test_client_errors_are_not_retried(fake: Any, action: str, status: int, hint: str) -> None:
    server = fake({"bad": [action] * 5})
    teacher = _teacher(server.url)
    with pytest.raises(GenerationRequestError) as info:
        teacher.generate_many([_msgs("ok"), _msgs("bad")], PARAMS)
    assert server.attempts["bad"] == 1 and teacher.retries == 0
    assert info.value.status == status
    assert f"HTTP {status}" in str(info.value) and hint in str(info.value) and "fake-model" in str(info.value)


def test_gives_up_after_max_retries(fake: Any) -> None:
    server = fake({"x": ["500"] * 10})
    with pytest.raises(GenerationRequestError, match=r"failed 3 times, last with HTTP 500") as info:
        _teacher(server.url, max_retries=2).generate_many([_msgs("x")], PARAMS)
    assert server.attempts["x"] == 3 and info.value.status == 500


def test_connection_refused_is_retried_then_reported(fake: Any) -> None:
    server = fake({})
    url = server.url
    server.shutdown()
    server.server_close()  # nothing listens on this port any more
    with pytest.raises(GenerationRequestError, match="APIConnectionError") as info:
        _teacher(url, max_retries=1).generate_many([_msgs("x")], PARAMS)
    assert info.value.status is None


def test_api_key_never_in_logs_repr_or_errors(fake: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, including openai's and httpx's debug output
    server = fake({"a": ["429", "500", "slow"], "echo-key": ["401"], "down": ["500"] * 5})
    teacher = _teacher(server.url, max_retries=3)
    texts = [repr(teacher), str(teacher.generate_many([_msgs("a")], PARAMS))]
    for prompt, retries in (("echo-key", 3), ("down", 1)):
        with pytest.raises(GenerationRequestError) as info:
            _teacher(server.url, max_retries=retries).generate_many([_msgs(prompt)], PARAMS)
        texts += [str(info.value), "".join(traceback.format_exception(info.value))]
    assert "Incorrect API key provided: Bearer ***" in texts[2]  # the server's echo, redacted
    assert server.auth == {f"Bearer {SECRET}"}
    assert "retrying" in caplog.text
    for text in [*texts, caplog.text]:
        assert SECRET not in text


def test_reasoning_content_is_kept_apart(fake: Any) -> None:
    server = fake({"r": ["think"]})
    reply = asyncio.run(_teacher(server.url).agenerate(_msgs("r"), PARAMS))
    assert reply == "echo:r" and reply.reasoning == "let me think"
    assert json.dumps([reply]) == '["echo:r"]'


def test_agenerate_in_user_loop_shares_the_bound(fake: Any) -> None:
    server = fake({}, delay_s=0.05)
    teacher = _teacher(server.url, max_concurrency=2)

    async def run() -> list[Reply]:
        try:
            return await asyncio.gather(*(teacher.agenerate(_msgs(f"q{i}"), PARAMS) for i in range(6)))
        finally:
            await teacher.aclose()

    assert asyncio.run(run()) == [f"echo:q{i}" for i in range(6)]
    assert server.max_inflight == 2

    async def nested() -> None:
        teacher.generate_many([_msgs("x")], PARAMS)

    with pytest.raises(RuntimeError, match="await agenerate"):
        asyncio.run(nested())


def test_retry_after_forms() -> None:
    assert _retry_after({"retry-after": "2"}) == 2.0
    assert _retry_after({"retry-after-ms": "150"}) == pytest.approx(0.15)
    assert _retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past
    assert _retry_after({"retry-after": "soon"}) is None
    assert _retry_after({}) is None


def test_generation_params_key_and_validation() -> None:
    assert GenerationParams(temperature=0, top_p=1).key() == GenerationParams(temperature=0.0, top_p=1.0).key()
    assert GenerationParams(seed=1).key() != GenerationParams(seed=2).key()
    with pytest.raises(ValueError, match=r"(?s)temperature=-1.0.*top_p=0.0.*max_new_tokens=0"):
        GenerationParams(temperature=-1, top_p=0, max_new_tokens=0)


def test_make_chat_and_env_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("MEMREADER_TEACHER_BASE_URL", "MEMREADER_TEACHER_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="MEMREADER_TEACHER_API_KEY"):
        make_chat("openai", model="m")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://fallback/v1")
    monkeypatch.setenv("MEMREADER_TEACHER_BASE_URL", "http://primary/v1")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    teacher = make_chat("openai", model="m")
    assert isinstance(teacher, OpenAIChat) and teacher.base_url == "http://primary/v1"
    assert SECRET not in repr(teacher)
    assert teacher._api_key == "EMPTY"  # an OpenAI key never goes to a third-party endpoint
    assert make_chat("openai", model="m", base_url="https://api.openai.com/v1")._api_key == SECRET
    monkeypatch.setenv("MEMREADER_TEACHER_API_KEY", "sk-own")
    assert make_chat("openai", model="m")._api_key == "sk-own"
    # the reader's prefix: never the teacher's URL
    monkeypatch.setenv("MEMREADER_READER_BASE_URL", "http://reader/v1")
    assert make_chat("openai", model="m", env_prefix="MEMREADER_READER").base_url == "http://reader/v1"
    assert isinstance(make_chat("local", batch_size=2), LocalChat)  # loads lazily: no model yet
    with pytest.raises(ValueError, match="'tgi' is not one of transformers, vllm, openai, auto"):
        make_chat("tgi")


@pytest.mark.parametrize(("owner", "mode", "sent"), [
    ("vllm", "auto", True), ("memreader", "auto", True), ("openai", "auto", False), ("deepseek", "auto", False),
    ("openai", "on", True), ("vllm", "off", False),
])
def test_grammar_goes_only_to_servers_that_take_it(fake: Any, owner: str, mode: str, sent: bool) -> None:
    server = fake({}, owned_by=owner)
    teacher = _teacher(server.url, guided=mode)
    grammar = 'start: "echo:" /[a-z]+/'
    replies = teacher.generate_many([_msgs("a"), _msgs("b")], GenerationParams(seed=0), grammars=[grammar, None])
    bodies = {b["messages"][-1]["content"]: b for b in server.bodies}
    assert ("structured_outputs" in bodies["a"]) is sent
    assert "structured_outputs" not in bodies["b"]  # no grammar for this row: never guided
    if sent:
        assert bodies["a"]["structured_outputs"] == {"grammar": grammar}
    assert [r.guided for r in replies] == [sent, False]
    assert replies[0].info()["guided"] is sent and replies[0].finish_reason == "stop"


@pytest.mark.integration
def test_local_teacher_on_embedded_model(memreader_home: Path) -> None:
    teacher = LocalChat(batch_size=2, device="cpu")
    prompts = [_msgs("Name a colour."), _msgs("What is 2 + 2? Answer with one number, please."), _msgs("Hi")]
    greedy = GenerationParams(temperature=0, max_new_tokens=8)
    batched = teacher.generate_many(prompts, greedy)
    assert all(isinstance(r, Reply) and r.strip() for r in batched)
    assert all(0 < r.completion_tokens <= 8 and r.prompt_tokens > 5 for r in batched)
    assert "<|im_end|>" not in "".join(batched)  # special tokens skipped
    # left padding must not change greedy output: each prompt alone gives the same text, in input order
    assert [asyncio.run(teacher.agenerate(p, greedy)) for p in prompts] == batched
    sampled = GenerationParams(temperature=0.9, top_p=0.9, max_new_tokens=8, seed=3)
    assert teacher.generate_many(prompts, sampled) == teacher.generate_many(prompts, sampled)
