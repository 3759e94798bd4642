"""A loopback server that speaks the OpenAI embeddings API and the Cohere/Jina rerank API, for tests.

- ``POST /v1/embeddings`` (OpenAI's wire format): ``{"model", "input": str | [str],
  "encoding_format": "float" | "base64", "dimensions"?}`` → ``{"object": "list", "data":
  [{"object": "embedding", "index", "embedding"}], "model", "usage": {"prompt_tokens",
  "total_tokens"}}``. A ``base64`` answer is the little-endian float32 bytes, as OpenAI sends it
  (the OpenAI SDK asks for it by default).
- ``POST /v1/rerank`` (Cohere's v1 and Jina's, which share it): ``{"model", "query",
  "documents": [str | {"text"}], "top_n"?}`` → ``{"id", "results": [{"index",
  "relevance_score"}], "meta"}``, best first.

Its vectors are deterministic: each word of the text (lower-cased, split on what is not a
letter or digit, and each CJK character alone) adds a signed unit at a position chosen by a
hash of the word, and the sum is scaled to unit length. Texts that share words point the same
way, so recall over it finds something, but nothing measured on it says anything about a real
model. Its rerank score is the share of the query's words a document holds.

Faults, each until changed: ``fail`` (an HTTP status answered to every request; ``fail_next``:
503 to the next n requests only), ``stall``
(seconds slept before answering), ``dimension`` (the vector length; a request's own
``dimensions`` wins). Every request body is kept in ``requests`` (embeddings) and
``rerank_requests``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORD = re.compile(r"[\u3400-\u9fff]|[^\W_]+", re.UNICODE)


def words(text: str) -> list[str]:
    """The fake's words of ``text``: runs of letters and digits, and each CJK character alone."""
    return [w.casefold() for w in WORD.findall(text)]


def hash_vector(text: str, dimension: int) -> list[float]:
    """The fake's unit vector of ``text`` (module docstring); a text with no words gets a fixed one."""
    vector = [0.0] * dimension
    for word in words(text) or [""]:
        digest = hashlib.sha256(word.encode()).digest()
        at = int.from_bytes(digest[:4], "little") % dimension
        vector[at] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def overlap(query: str, document: str) -> float:
    """The fake's rerank score: the share of the query's distinct words ``document`` holds."""
    wanted = set(words(query))
    return len(wanted & set(words(document))) / len(wanted) if wanted else 0.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that hung up is expected
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class FakeEmbeddings:
    """The server; ``with FakeEmbeddings() as fake:`` serves on a free loopback port."""

    def __init__(self, *, dimension: int = 64, host: str = "127.0.0.1", port: int = 0) -> None:
        self.dimension = dimension
        self.fail: int | None = None
        """An HTTP status answered to every request while set."""
        self.fail_next = 0
        """Requests still to answer with 503 before answering again (a brief outage)."""
        self.stall = 0.0
        """Seconds slept before each answer."""
        self.requests: list[dict[str, Any]] = []
        self.rerank_requests: list[dict[str, Any]] = []
        self.texts_embedded = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.rstrip("/").endswith("/rerank"):
                    fake.rerank_requests.append(body)
                else:
                    fake.requests.append(body)
                if fake.stall:
                    time.sleep(fake.stall)
                failing = fake.fail
                if failing is None and fake.fail_next > 0:
                    fake.fail_next -= 1
                    failing = 503
                if failing is not None:
                    self._send(failing, {"error": {"message": "the fake is down", "type": "server_error"}})
                elif self.path.rstrip("/").endswith("/rerank"):
                    self._send(200, fake._rerank(body))
                elif self.path.rstrip("/").endswith("/embeddings"):
                    self._send(200, fake._embeddings(body))
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    pass

        self.server = _Server((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        texts = body.get("input", [])
        texts = [texts] if isinstance(texts, str) else list(texts)
        dimension = int(body.get("dimensions") or self.dimension)
        self.texts_embedded += len(texts)
        data = []
        for i, text in enumerate(texts):
            vector = hash_vector(str(text), dimension)
            encoded: Any = (
                base64.b64encode(struct.pack(f"<{dimension}f", *vector)).decode()
                if body.get("encoding_format") == "base64"
                else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(len(words(str(t))) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": body.get("model", "fake"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _rerank(self, body: dict[str, Any]) -> dict[str, Any]:
        query = str(body.get("query", ""))
        documents = [d.get("text", "") if isinstance(d, dict) else str(d) for d in body.get("documents", [])]
        scored = sorted(((i, overlap(query, d)) for i, d in enumerate(documents)), key=lambda item: (-item[1], item[0]))
        top = body.get("top_n")
        if top:
            scored = scored[: int(top)]
        return {
            "id": "rerank-fake",
            "results": [{"index": i, "relevance_score": s} for i, s in scored],
            "meta": {"billed_units": {"search_units": 1}},
            "usage": {"total_tokens": sum(len(words(d)) for d in documents) + len(words(query))},
        }

    @property
    def api_base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeEmbeddings:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
