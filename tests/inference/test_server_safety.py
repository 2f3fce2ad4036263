"""``memreader serve`` safe defaults on a tiny random model: API key, generic 500s, the max_tokens
cap, and generation that stops when its client hangs up."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from memreader.core.generation import GenerationParams, generate_chat_batch
from memreader.inference.server import ServeConfig, build_server

pytestmark = pytest.mark.integration


def _post(url: str, body: dict[str, Any], key: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture()
def keyed(tiny_model: str):
    srv = build_server(ServeConfig(tiny_model, port=0, device="cpu", default_max_tokens=4, max_tokens_cap=32),
                       api_key="k-123")
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_api_key_is_required_except_for_health(keyed) -> None:
    assert _post(keyed.url, BODY)[0] == 401
    assert _post(keyed.url, BODY, key="wrong")[0] == 401
    status, body = _post(keyed.url, BODY, key="k-123")
    assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")
    with urllib.request.urlopen(keyed.url.removesuffix("/v1") + "/health", timeout=10) as r:
        assert r.status == 200
    req = urllib.request.Request(keyed.url + "/models")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 401


def test_max_tokens_cap_and_generic_500(keyed, monkeypatch) -> None:
    status, body = _post(keyed.url, {**BODY, "max_tokens": 33}, key="k-123")
    assert status == 400 and "cap of 32" in body["error"]["message"]

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("secret internal detail /home/user/model")

    monkeypatch.setattr("memreader.inference.server.generate_chat_batch", boom)
    status, body = _post(keyed.url, BODY, key="k-123")
    assert status == 500 and "secret" not in json.dumps(body) and "server log" in body["error"]["message"]


def test_stop_event_ends_generation_early(tiny_model: str) -> None:
    from memreader.core.runtime import load_causal_lm, runtime

    model, tok = load_causal_lm(tiny_model, rt=runtime("cpu"))
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.perf_counter()
    gen = generate_chat_batch(model, tok, [[{"role": "user", "content": "hi"}]],
                              GenerationParams(temperature=0, max_new_tokens=100_000), stop_event=stop)[0]
    assert time.perf_counter() - t0 < 30 and gen.finish_reason == "length" and gen.completion_tokens < 100_000


def test_client_hang_up_stops_the_generation(keyed, monkeypatch) -> None:
    """The watcher sets the stop event as soon as the client's socket closes."""
    import socket

    seen: dict[str, Any] = {}
    real = generate_chat_batch

    def spy(*a: Any, stop_event: threading.Event | None = None, **k: Any) -> Any:
        assert stop_event is not None
        seen["stopped"] = stop_event.wait(timeout=20)  # a long generation, until the client hangs up
        return real(*a, stop_event=stop_event, **k)

    monkeypatch.setattr("memreader.inference.server.generate_chat_batch", spy)
    host, port = keyed.server_address[:2]
    body = json.dumps({**BODY, "max_tokens": 32}).encode()
    with socket.create_connection((host, port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-123\r\n"
                  b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)
    deadline = time.time() + 20
    while "stopped" not in seen and time.time() < deadline:
        time.sleep(0.1)
    assert seen.get("stopped") is True
