"""``memreader serve``: a small OpenAI-compatible chat server around one in-process transformers model.

    memreader serve --config configs/inference/serve_smollm2.yaml --set adapter=artifacts/runs/demo/train
    memreader serve --model smollm2-135m-instruct --port 8000      # shortcut flags for the same keys

Keys: :class:`ServeConfig` (``--help``). Endpoints, auth and limits: docs/ENGINES.md (`vllm serve` (the HTTP path)).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from memreader.core.config import field
from memreader.core.errors import MemReaderError
from memreader.core.generation import GenerationParams, generate_chat_batch
from memreader.core.paths import run_dir, write_resolved_config
from memreader.core.registry import SMOLLM2
from memreader.core.stage import Flag, Stage

log = logging.getLogger(__name__)

_MAX_BODY_BYTES = 16 * 1024 * 1024
_ROLES = {"system", "user", "assistant"}


@dataclass
class ServeConfig:
    """One server: the model, its adapter, the address and the request limits (the API key is not a config
    key: it comes from --api-key or $MEMREADER_SERVE_API_KEY, so it never lands in a config file)."""

    model: str = field(SMOLLM2, help="model name from the registry, a local folder, or a hub id")
    adapter: str | None = field(None, help="optional LoRA adapter folder (a training run's train/ folder)")
    host: str = field("127.0.0.1", help="interface to bind (0.0.0.0 exposes it to the network: set an API key)")
    port: int = field(8000, ge=0, le=65535, help="TCP port; 0 picks a free one")
    served_model_name: str | None = field(None, help="model id clients ask for (default: model)")
    device: str = field("auto", help="auto, cpu or cuda[:i]")
    default_max_tokens: int = field(512, ge=1, help="max_tokens for requests that do not set it")
    max_tokens_cap: int = field(4096, ge=1, help="largest max_tokens a request may ask for (larger ones get 400)")
    run: str | None = field(None, help="run name: the resolved config goes to $MEMREADER_HOME/runs/<run>/serve/ "
                            "(default: a timestamp)")

    def problems(self) -> list[str]:
        """Every problem with the values, for :func:`memreader.core.config.load_config`."""
        problems = []
        if self.adapter and not (Path(self.adapter) / "adapter_config.json").is_file():
            problems.append(f"adapter={self.adapter!r} has no adapter_config.json: pass a LoRA output folder "
                            "($MEMREADER_HOME/runs/<run>/train)")
        if self.default_max_tokens > self.max_tokens_cap:
            problems.append(f"default_max_tokens={self.default_max_tokens} is above max_tokens_cap="
                            f"{self.max_tokens_cap}: need default_max_tokens <= max_tokens_cap")
        return problems


class RequestError(Exception):
    """A bad request: answered with an OpenAI-style JSON error, never a stack trace."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{name}={value!r} must be a number in [{low}, {high}]", param=name)
    return float(value)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """Validate ``messages``; content given as a list of text parts is joined into one string."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise RequestError(f"messages[{i}] needs a role in {sorted(_ROLES)}, got {m!r:.100}", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
                raise RequestError(f"messages[{i}].content parts must all be {{type: text, text: ...}}",
                                   param="messages")
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string, got {content!r:.100}", param="messages")
        out.append({"role": m["role"], "content": content})
    return out


class ChatServer(ThreadingHTTPServer):
    """HTTP server owning one model; ``generate`` is serialised by a lock."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], model: Any, tokenizer: Any, model_ids: list[str],
                 default_max_tokens: int = 512, api_key: str | None = None, max_tokens_cap: int = 4096) -> None:
        super().__init__(address, _Handler)
        self.model, self.tokenizer, self.model_ids = model, tokenizer, model_ids
        self.default_max_tokens, self.max_tokens_cap = default_max_tokens, max_tokens_cap
        self.api_key = api_key or None
        self.context_length = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        self.created = int(time.time())
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        """Base URL for OpenAI clients, e.g. ``http://127.0.0.1:8000/v1``."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def models_payload(self) -> dict[str, Any]:
        """The ``GET /v1/models`` answer."""
        return {"object": "list", "data": [
            {"id": m, "object": "model", "created": self.created, "owned_by": "memreader"} for m in self.model_ids
        ]}

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the server's key (always, when it has none)."""
        if self.api_key is None:
            return True
        given = (header or "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), self.api_key.encode())

    def complete(self, body: dict[str, Any], connection: Any = None) -> dict[str, Any]:
        """Validate one chat completion request and answer it in the OpenAI schema. With the
        client's ``connection``, generation stops as soon as the client hangs up."""
        model = body.get("model", self.model_ids[0])
        if model not in self.model_ids:
            raise RequestError(f"model {model!r} is not served here; use one of {self.model_ids}",
                               param="model", status=404, code="model_not_found")
        if body.get("stream"):
            raise RequestError("stream=true is not supported by memreader serve; send stream=false", param="stream")
        if body.get("n", 1) != 1:
            raise RequestError(f"n={body['n']!r} is not supported; send n=1 and repeat the request", param="n")
        messages = _messages(body)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"max_tokens={max_tokens!r} must be an integer >= 1", param="max_tokens")
        if max_tokens > self.max_tokens_cap:
            raise RequestError(f"max_tokens={max_tokens} is above this server's cap of {self.max_tokens_cap}",
                               param="max_tokens")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RequestError(f"seed={seed!r} must be an integer", param="seed")
        params = GenerationParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
            max_new_tokens=max_tokens,
            repetition_penalty=_number(body, "repetition_penalty", 1.0, 1e-9, 10.0),
            seed=seed,
        )
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_len = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if self.context_length and prompt_len + max_tokens > self.context_length:
            raise RequestError(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the model's context of "
                f"{self.context_length} tokens; shorten the messages or lower max_tokens",
                param="messages", code="context_length_exceeded")
        grammar = _grammar(body)
        if grammar is not None:
            from memreader.core.generation.guided import compile_matcher, ll_tokenizer

            # Compiled here as well as in generation (milliseconds): a bad grammar gets its 400 at once
            # instead of after waiting for the model lock.
            try:
                compile_matcher(ll_tokenizer(self.tokenizer), grammar)
            except ValueError as exc:
                raise RequestError(str(exc), param="structured_outputs.grammar") from None
        stop = threading.Event()
        watcher = _watch_disconnect(connection, stop) if connection is not None else None
        try:
            with self.lock:
                if stop.is_set():
                    raise RequestError("the client went away before generation started", status=499)
                gen = generate_chat_batch(self.model, self.tokenizer, [messages], params, [grammar],
                                          stop_event=stop)[0]
        finally:
            stop.set()
            if watcher is not None:
                watcher.join(timeout=2)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                         "finish_reason": gen.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
                      "total_tokens": gen.prompt_tokens + gen.completion_tokens},
        }


def _grammar(body: dict[str, Any]) -> str | None:
    """The lark grammar of vLLM's ``structured_outputs`` field (the only structured output served here)."""
    so = body.get("structured_outputs")
    if so is None:
        return None
    if not isinstance(so, dict) or set(so) - {"grammar"} or not isinstance(so.get("grammar"), str):
        raise RequestError("structured_outputs must be {\"grammar\": \"<lark grammar>\"}; json, regex and choice "
                           "are not served by memreader serve", param="structured_outputs")
    return so["grammar"]


def _watch_disconnect(connection: Any, stop: threading.Event) -> threading.Thread:
    """Set ``stop`` when the client closes its connection (a readable socket with nothing to read)."""

    def watch() -> None:
        while not stop.is_set():
            try:
                ready, _, _ = select.select([connection], [], [], 0.2)
                if ready and connection.recv(1, socket.MSG_PEEK) == b"":
                    log.info("client disconnected: stopping its generation")
                    stop.set()
            except (OSError, ValueError):  # the socket is gone: same as a hang-up
                stop.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


class _Handler(BaseHTTPRequestHandler):
    server: ChatServer
    protocol_version = "HTTP/1.1"  # keep-alive, so OpenAI clients reuse connections

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client hung up; nothing left to tell it
            log.info("client went away before the %d answer was sent", status)

    def _error(self, err: RequestError) -> None:
        kind = {401: "authentication_error", 404: "not_found_error", 500: "server_error"}.get(err.status,
                                                                                               "invalid_request_error")
        self._send(err.status, {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}})

    def _refuse_unauthorized(self) -> bool:
        if self.server.authorized(self.headers.get("Authorization")):
            return False
        self._error(RequestError("missing or wrong API key: send 'Authorization: Bearer <key>'", status=401,
                                 code="invalid_api_key"))
        return True

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if path != "/health" and self._refuse_unauthorized():
            return
        if path == "/v1/models":
            self._send(HTTPStatus.OK, self.server.models_payload())
        elif path == "/health":
            self._send(HTTPStatus.OK, {"status": "ok"})
        else:
            self._error(RequestError(f"no route GET {self.path}; try /v1/models", status=404))

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        start = time.perf_counter()
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > _MAX_BODY_BYTES:
                self.close_connection = True  # the body (if any) was not read
                raise RequestError(f"request body must be 1..{_MAX_BODY_BYTES} bytes with a Content-Length header",
                                   status=413 if length > _MAX_BODY_BYTES else 400)
            raw = self.rfile.read(length)
            if self._refuse_unauthorized():
                return
            if path != "/v1/chat/completions":
                raise RequestError(f"no route POST {self.path}; use /v1/chat/completions", status=404)
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RequestError(f"request body is not valid JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise RequestError("request body must be a JSON object")
            answer = self.server.complete(body, self.connection)
        except RequestError as err:
            log.info("POST %s -> %d %s", path, err.status, err.message)
            self._error(err)
            return
        except Exception:  # a server-side failure: traceback to the log only, a generic 500 (clients retry 5xx)
            log.exception("POST %s failed", path)
            self._error(RequestError("internal server error (details are in the server log)", status=500))
            return
        usage = answer["usage"]
        log.info("POST %s -> 200, %d+%d tokens in %.2f s", path, usage["prompt_tokens"],
                 usage["completion_tokens"], time.perf_counter() - start)
        self._send(HTTPStatus.OK, answer)


def build_server(cfg: ServeConfig, api_key: str | None = None) -> ChatServer:
    """Load the model (+ LoRA adapter) and bind the server; ``port=0`` picks a free port (see ``.url``).

    Served model ids: ``served_model_name`` if given, else the model name, plus ``"memreader"`` when an
    adapter is loaded (the name the vLLM command above uses). Unlike vLLM, every id answers with the
    same model: the adapted one when an adapter is given.
    """
    from memreader.core.runtime import load_causal_lm, runtime

    _check_port(cfg.host, cfg.port)  # before the (slow) model load
    model, tokenizer = load_causal_lm(cfg.model, adapter=cfg.adapter, rt=runtime(cfg.device))
    ids = [cfg.served_model_name or cfg.model]
    if cfg.adapter and "memreader" not in ids:
        ids.append("memreader")
    return ChatServer((cfg.host, cfg.port), model, tokenizer, ids, cfg.default_max_tokens, api_key, cfg.max_tokens_cap)


def _check_port(host: str, port: int) -> None:
    """Fail fast, naming the fix, when the address cannot be bound."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise MemReaderError(f"cannot listen on {host}:{port} ({exc.strerror})",
                                 "stop the process using that port, or pass another --port (0 picks a free one)") from None


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer <key>' on every request except /health "
                             "(default: $MEMREADER_SERVE_API_KEY; no key = open, for 127.0.0.1 only)")


def _run_stage(cfg: ServeConfig, args: argparse.Namespace) -> int:
    """Serve until Ctrl-C."""
    api_key = args.api_key or os.environ.get("MEMREADER_SERVE_API_KEY") or None
    if api_key is None and cfg.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who reaches it can use the model "
                    "(set --api-key or MEMREADER_SERVE_API_KEY)", cfg.host)
    server = build_server(cfg, api_key)
    folder = run_dir(cfg.run or f"serve-{time.strftime('%Y%m%d-%H%M%S')}", "serve")
    write_resolved_config(folder, cfg)
    log.info("serving %s at %s (OpenAI-compatible; Ctrl-C stops); config in %s", ", ".join(server.model_ids),
             server.url, folder / "config.yaml")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopping the server")
    finally:
        server.server_close()
    return 0


STAGE = Stage("serve", "OpenAI-compatible HTTP server over a local model (+ adapter)", run=_run_stage, config=ServeConfig,
              example_dir="configs/inference/ (serve_*.yaml)", arguments=_arguments, needs_args=True,
              models=lambda cfg: {"model": cfg.model},
              flags=tuple(Flag(key, kind) for key, kind in {  # --port 8001 is --set port=8001
                  "model": str, "adapter": str, "host": str, "port": int, "served_model_name": str, "device": str,
                  "default_max_tokens": int, "max_tokens_cap": int}.items()))

if __name__ == "__main__":
    from memreader.cli import module_main

    raise SystemExit(module_main("serve"))
