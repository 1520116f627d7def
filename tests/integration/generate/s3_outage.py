"""An HTTP proxy in front of the moto S3 server that can fail every request on demand.

``S3Outage(moto_endpoint)`` listens on 127.0.0.1 (ephemeral port) and forwards each request to
moto unchanged; while ``mode`` is ``"503"`` it answers every request with 503 SlowDown (an
overloaded or unreachable service), while ``"403"`` with 403 AccessDenied (a changed bucket
policy), while ``"expired"`` with S3's 400 ExpiredToken (temporary credentials past their end;
a HEAD's answer has no body, as S3's has none). ``trip(text, mode)`` switches to ``mode`` by
itself once a PUT whose path holds ``text`` has been answered (an outage that starts right
after the first committed shard, whatever the test's polling). A request whose body ends early
is dropped, as S3 drops it. ``flaky(text, rate, rng)`` instead fails GETs at random (503 or a
dropped connection), as a busy S3 does now and then. Point a client at ``url`` with
AWS_ENDPOINT_URL. Counts of forwarded, failed and dropped requests are kept for the test's
assertions.

``kms = True`` gives objects the ETags SSE-KMS gives them (no MD5 of the bytes: a digest of
the key and moto's ETag, with its ``-<parts>``) on HEAD and GET; ``lose(text)`` forwards the
next upload whose path holds ``text`` (a PUT of a whole object, or the POST that completes a
multipart upload) and then drops its answer, as a connection cut after S3 stored the object.
"""

from __future__ import annotations

import hashlib
import http.client
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal
from urllib.parse import urlsplit

Mode = Literal["ok", "503", "403", "expired"]
_ERRORS = {
    "503": (503, "SlowDown", "Please reduce your request rate (simulated outage)."),
    "403": (403, "AccessDenied", "Access Denied (simulated policy change)."),
    "expired": (400, "ExpiredToken", "The provided token has expired."),
}
_READS = ("HEAD", "GET")


def _kms_etag(path: str, etag: str) -> str:
    """The ETag an SSE-KMS object has: not the MD5 of its bytes (the ``-<parts>`` kept)."""
    plain = etag.strip('"')
    parts = plain[plain.index("-") :] if "-" in plain else ""
    return '"' + hashlib.md5(f"kms:{path}:{plain}".encode()).hexdigest() + parts + '"'


_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class S3Outage:
    """A switchable proxy to ``target`` (``http://host:port``); use as a context manager."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.mode: Mode = "ok"
        self.forwarded = 0
        self.failed = 0
        self.truncated = 0
        self._trip: tuple[str, Mode] | None = None
        self._flaky: tuple[str, float, random.Random, bool] | None = None
        self.kms = False
        self.lost = 0
        self._lose: str | None = None
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunk = self.rfile.read(size)
                        if len(chunk) < size:
                            return None
                        chunks.append(chunk)
                        self.rfile.readline()
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size)
                return body if len(body) == size else None

            def _handle(self) -> None:
                body = self._body()
                if body is None:
                    # the client went away mid-body: like S3, store nothing (never forward a
                    # truncated body, which moto would keep as a short object)
                    outer.truncated += 1
                    self.close_connection = True
                    return
                mode = outer.mode
                fault = outer._fault(self.command, self.path)
                if fault == "reset":  # the connection drops before any answer
                    outer.failed += 1
                    self.close_connection = True
                    return
                if fault is not None:
                    mode = fault
                if mode != "ok":
                    outer.failed += 1
                    status, code, message = _ERRORS[mode]
                    data = (
                        '<?xml version="1.0" encoding="UTF-8"?>\n'
                        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                    return
                outer.forwarded += 1
                conn = http.client.HTTPConnection(*outer.target, timeout=60)
                try:
                    headers = {
                        k: v
                        for k, v in self.headers.items()
                        if k.lower() not in _HOP and k.lower() != "content-length"
                    }
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    if outer._lost(self.command, self.path, resp.status):
                        self.close_connection = True  # stored, but the answer never comes
                        return
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP and k.lower() != "content-length":
                            if k.lower() == "etag" and outer.kms and self.command in _READS:
                                v = _kms_etag(self.path, v)
                            self.send_header(k, v)
                    # a HEAD answer has no body: its Content-Length is the object's size
                    length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", length or str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()
                if self.command == "PUT" and resp.status == 200:
                    outer._tripped(self.path)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def flaky(self, text: str, rate: float, rng: random.Random, first: bool = False) -> None:
        """Fail each GET whose path holds ``text`` with probability ``rate``, as 503 SlowDown
        or a connection dropped before the answer (chosen by ``rng``); ``first``: the first
        such GET fails (503) whatever the draw."""
        with self._lock:
            self._flaky = (text, rate, rng, first)

    def _fault(self, command: str, path: str) -> Literal["503", "reset"] | None:
        with self._lock:
            if self._flaky is None or command != "GET" or self._flaky[0] not in path:
                return None
            text, rate, rng, first = self._flaky
            self._flaky = (text, rate, rng, False)
            if first:
                return "503"
            if rng.random() >= rate:
                return None
            return "503" if rng.random() < 0.5 else "reset"

    def lose(self, text: str) -> None:
        """Drop the answer to the next upload whose path holds ``text`` (after moto stored it)."""
        with self._lock:
            self._lose = text

    def _lost(self, command: str, path: str, status: int) -> bool:
        upload = (command == "PUT" and "partNumber=" not in path) or (
            command == "POST" and "uploadId=" in path
        )
        with self._lock:
            if not upload or status != 200 or self._lose is None or self._lose not in path:
                return False
            self._lose = None
            self.lost += 1
            return True

    def trip(self, text: str, mode: Mode) -> None:
        """Switch to ``mode`` once a PUT to a path holding ``text`` has succeeded."""
        with self._lock:
            self._trip = (text, mode)

    def _tripped(self, path: str) -> None:
        with self._lock:
            if self._trip is not None and self._trip[0] in path:
                self.mode = self._trip[1]
                self._trip = None

    def __enter__(self) -> S3Outage:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
