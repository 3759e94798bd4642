"""A loopback OpenAI-compatible chat completions server for tests.

It answers ``POST /v1/chat/completions`` from a script: each queued entry is a
reply text or an HTTP error ``(status, body)``. When the queue is empty it
echoes a fixed reply. Every request body is kept in ``requests``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeLLM:
    def __init__(self) -> None:
        self.script: deque[Any] = deque()
        self.requests: list[dict[str, Any]] = []
        self.default_reply = "I hear you."
        self.prompt_tokens = 123
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append(body)
                step = fake.script.popleft() if fake.script else fake.default_reply
                if isinstance(step, tuple):
                    status, payload = step
                    data = json.dumps({"error": {"message": payload, "type": "server_error", "code": status}}).encode()
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                data = json.dumps(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "fake"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": step}, "finish_reason": "stop"}
                        ],
                        "usage": {
                            "prompt_tokens": fake.prompt_tokens,
                            "completion_tokens": 7,
                            "total_tokens": fake.prompt_tokens + 7,
                        },
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> "FakeLLM":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
