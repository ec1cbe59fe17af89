"""A real HTTP server on loopback that speaks the OpenAI chat-completions protocol, for tests and bench.

`OpenAIStub` listens on 127.0.0.1 (a free port), answers `POST /v1/chat/completions` with the OpenAI
response shape (id, object, created, model, choices[].message, usage) and `GET /v1/models`. What it
does for each request is scriptable:

- `stub.push(*behaviours)`: behaviours consumed one per request, in arrival order;
- `stub.rule = fn(hit_number, body) -> Behaviour | None`: decided from the request itself (safe with
  concurrent clients);
- otherwise `Behaviour.ok()` after `latency` seconds, whose content is `answer(body)` (default: the
  content of the first assistant message in the request, i.e. the prompt's own few-shot answer, which
  follows the prompt's schema).

Behaviours: `ok(content)`, `rate_limited(retry_after)` (429 + Retry-After), `server_error(status)`,
`hang(seconds)` (sleeps past the client's timeout), `malformed()` (200 with a broken JSON body),
`invalid(content)` (a well-formed completion whose content fails the prompt's schema).
The server counts `hits` (requests received) and keeps every request body in `bodies`.

Run it by hand (`GET /stats` gives the counts): `python tests/openai_stub.py --port 8011 --latency 0.2` (then point
`synthesize.openai.base_url` at http://127.0.0.1:8011/v1).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Behaviour:
    kind: str = "ok"  # ok | status | hang | malformed
    status: int = 200
    content: str | None = None
    retry_after: float | None = None
    delay: float = 0.0

    @staticmethod
    def ok(content: str | None = None, delay: float = 0.0) -> Behaviour:
        return Behaviour("ok", content=content, delay=delay)

    @staticmethod
    def invalid(content: str = '{"unexpected": true}') -> Behaviour:
        return Behaviour("ok", content=content)

    @staticmethod
    def rate_limited(retry_after: float | None = 1.0) -> Behaviour:
        return Behaviour("status", status=429, retry_after=retry_after)

    @staticmethod
    def server_error(status: int = 500) -> Behaviour:
        return Behaviour("status", status=status)

    @staticmethod
    def hang(seconds: float = 30.0) -> Behaviour:
        return Behaviour("hang", delay=seconds)

    @staticmethod
    def malformed() -> Behaviour:
        return Behaviour("malformed")


def few_shot_answer(body: dict[str, Any]) -> str:
    """The first assistant message of the request (a prompt's few-shot answer), else `{}`."""
    for m in body.get("messages", []):
        if m.get("role") == "assistant":
            return m.get("content") or "{}"
    return "{}"


class OpenAIStub:
    """A threaded HTTP server speaking the OpenAI chat-completions protocol on 127.0.0.1."""

    def __init__(
        self,
        *,
        latency: float = 0.0,
        answer: Callable[[dict[str, Any]], str] = few_shot_answer,
        port: int = 0,
    ) -> None:
        self.latency = latency
        self.answer = answer
        self.rule: Callable[[int, dict[str, Any]], Behaviour | None] | None = None
        self.script: deque[Behaviour] = deque()
        self.hits = 0
        self.completed = 0
        self.bodies: list[dict[str, Any]] = []
        self.auth_headers: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self.script.extend(behaviours)

    def reset_counts(self) -> None:
        with self._lock:
            self.hits = 0
            self.completed = 0
            self.bodies.clear()

    def start(self) -> OpenAIStub:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-stub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # called by the handler
    def _next(self, body: dict[str, Any]) -> tuple[int, Behaviour]:
        with self._lock:
            self.hits += 1
            n = self.hits
            self.bodies.append(body)
            scripted = self.script.popleft() if self.script else None
        if scripted is None and self.rule is not None:
            scripted = self.rule(n, body)
        return n, scripted or Behaviour.ok()


def _handler(stub: OpenAIStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
        disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence per-request logging
            return

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): fine
                self.close_connection = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.rstrip("/") == "/stats":  # for a stub running in another process (bench)
                with stub._lock:
                    counts = {"hits": stub.hits, "completed": stub.completed}
                self._send(200, json.dumps(counts).encode())
            elif self.path.rstrip("/") == "/v1/models":
                self._send(
                    200, json.dumps({"object": "list", "data": [{"id": "stub-model", "object": "model"}]}).encode()
                )
            else:
                self._send(404, b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}).encode())
                return
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                self._send(400, b'{"error": {"message": "request body is not JSON"}}')
                return
            with stub._lock:
                stub.auth_headers.append(self.headers.get("Authorization", ""))
            n, b = stub._next(body)
            delay = b.delay if b.kind == "hang" else (b.delay or stub.latency)
            if delay:
                time.sleep(delay)
            if b.kind == "status":
                headers = {} if b.retry_after is None else {"Retry-After": f"{b.retry_after:g}"}
                err = {"error": {"message": f"stub status {b.status}", "type": "stub", "code": b.status}}
                self._send(b.status, json.dumps(err).encode(), headers)
            elif b.kind == "malformed":
                self._send(200, b'{"id": "chatcmpl-broken", "choices": [{"message": {"content": "')
            else:
                content = b.content if b.content is not None else stub.answer(body)
                prompt_chars = sum(len(m.get("content") or "") for m in body.get("messages", []))
                resp = {
                    "id": f"chatcmpl-stub-{n}",
                    "object": "chat.completion",
                    "created": 1764633600,
                    "model": body.get("model", "stub-model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": max(1, prompt_chars // 4),
                        "completion_tokens": max(1, len(content) // 4),
                        "total_tokens": max(1, prompt_chars // 4) + max(1, len(content) // 4),
                    },
                }
                self._send(200, json.dumps(resp).encode())
            with stub._lock:
                stub.completed += 1

    return Handler


def main() -> None:  # pragma: no cover - manual use
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--port-file", help="write the port here once listening (use with --port 0)")
    args = ap.parse_args()
    stub = OpenAIStub(latency=args.latency, port=args.port).start()
    if args.port_file:
        Path(args.port_file).write_text(str(stub.port), encoding="utf-8")
    print(f"OpenAI stub on {stub.base_url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stub.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
