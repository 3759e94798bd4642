"""Request bodies are refused with 413 while they stream in: a declared size over the
limit is refused before any byte is read, and a chunked body once it passes the limit."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from runtime.service.api.limits import MULTIPART_OVERHEAD_BYTES


def _connect(api_server: str) -> socket.socket:
    url = urlparse(api_server)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    return sock


def _response(sock: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, json.loads(rest[:length])


def _send_chunks(sock: socket.socket, total: int, chunk: int = 256 * 1024, first: bytes = b"") -> int:
    """Send ``first`` then ``total`` bytes as HTTP chunks until the server stops reading; bytes sent."""
    sent = 0
    piece = b"x" * chunk
    try:
        if first:
            sock.sendall(f"{len(first):x}\r\n".encode() + first + b"\r\n")
        while sent < total:
            sock.sendall(f"{chunk:x}\r\n".encode() + piece + b"\r\n")
            sent += chunk
    except (TimeoutError, BrokenPipeError, ConnectionResetError):
        pass
    return sent


@pytest.mark.parametrize(
    "content_type,limit_setting",
    [
        pytest.param("application/json", "COMPANION_MAX_JSON_BYTES", id="json"),
        pytest.param("multipart/form-data; boundary=xyz", "COMPANION_MAX_FILE_BYTES", id="upload"),
    ],
)
def test_a_declared_size_over_the_limit_is_refused_before_reading(api_server, content_type, limit_setting):
    sock = _connect(api_server)
    started = time.monotonic()
    sock.sendall(
        (
            "POST /v1/users/ana/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ck_none\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {1024**3}\r\n\r\n"
        ).encode()
        + b"x" * 1024
    )
    status, body = _response(sock)
    sock.close()
    assert status == 413
    assert body["error"]["code"] == "request_too_large" and limit_setting in body["error"]["message"]
    assert time.monotonic() - started < 5


def test_a_chunked_json_body_is_refused_once_it_passes_the_limit(api_server, api_engine):
    limit = api_engine.settings.max_json_bytes
    sock = _connect(api_server)
    sock.settimeout(5)
    sock.sendall(
        b"POST /v1/users HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ck_none\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    sent = _send_chunks(sock, total=200 * limit)
    status, body = _response(sock)
    sock.close()
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert sent < 100 * limit  # the server stopped reading long before the end


def test_a_chunked_upload_over_the_file_limit_is_refused(api_server, api_engine):
    limit = api_engine.settings.max_file_bytes + MULTIPART_OVERHEAD_BYTES
    sock = _connect(api_server)
    sock.settimeout(5)
    sock.sendall(
        b"POST /v1/users/ana/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ck_none\r\n"
        b"Content-Type: multipart/form-data; boundary=xyz\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    part = b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\nContent-Type: application/octet-stream\r\n\r\n'
    sent = _send_chunks(sock, total=4 * limit, chunk=1024 * 1024, first=part)
    status, body = _response(sock)
    sock.close()
    assert status == 413 and "COMPANION_MAX_FILE_BYTES" in body["error"]["message"]
    assert sent < 3 * limit


def test_bodies_within_the_limits_still_work(api_server, new_app):
    import httpx

    _, key = new_app()
    http = httpx.Client(base_url=api_server, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    session = http.post("/v1/sessions", json={"user_id": "alice"}).json()
    r = http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "hello " * 1000, "stream": False})
    assert r.status_code == 200, r.text
