"""A real HTTP server on 127.0.0.1 for the remote-source tests and benchmarks.

It serves a folder with RFC 7233 single-range support (206 + Content-Range, 416 past the end),
an ETag and Last-Modified per file, keep-alive, and knobs that make it misbehave on purpose:
``ignore_range`` (200 + the whole body), ``always_416``, ``redirect`` (paths under ``/r/`` answer
302 to the real path), ``cut_short`` (the body stops half way and the connection closes),
``change_after`` (the ETag changes after N requests), ``claimed_size`` (a Content-Range total
that lies), ``delay`` (seconds before each answer, to
model a real network). Counters: requests and body bytes sent.
"""
from __future__ import annotations

import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


class Knobs:
    def __init__(self):
        self.ignore_range = False
        self.always_416 = False
        self.cut_short = False
        self.change_after: int | None = None
        self.delay = 0.0
        self.claimed_size: int | None = None   # a lying Content-Range total
        self.requests = 0
        self.bytes_sent = 0
        self.lock = threading.Lock()


def _handler(root: str, knobs: Knobs):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def setup(self):
            super().setup()
            # headers and body go out as two writes: without this, Nagle's algorithm holds the
            # body until the client's delayed ACK (40 ms per response), as no real server does
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self):  # noqa: N802 — http.server's name
            with knobs.lock:
                knobs.requests += 1
                n = knobs.requests
            if knobs.delay:
                time.sleep(knobs.delay)
            path = unquote(self.path.split("?", 1)[0])
            if path.startswith("/r/"):
                self.send_response(302)
                self.send_header("Location", path[2:])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            full = os.path.join(root, path.lstrip("/"))
            if not os.path.isfile(full):
                self.send_error(404)
                return
            size = os.path.getsize(full)
            st = os.stat(full)
            changed = knobs.change_after is not None and n > knobs.change_after
            etag = f'"{st.st_mtime_ns:x}-{size:x}{"-v2" if changed else ""}"'
            rng = self.headers.get("Range")
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
            if knobs.always_416 or (m and int(m.group(1)) >= size):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if m and not knobs.ignore_range:
                start = int(m.group(1))
                end = min(size - 1, int(m.group(2))) if m.group(2) else size - 1
                self.send_response(206)
                total = knobs.claimed_size or size
                self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
            else:
                start, end = 0, size - 1
                self.send_response(200)
            length = end - start + 1
            self.send_header("Content-Length", str(length))
            self.send_header("ETag", etag)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            send = length // 2 if knobs.cut_short else length
            with open(full, "rb") as f:
                f.seek(start)
                left = send
                try:
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        with knobs.lock:  # counted before sending: the client may be faster
                            knobs.bytes_sent += len(chunk)
                        self.wfile.write(chunk)
                        left -= len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                    return
            if knobs.cut_short:
                self.close_connection = True

    return Handler


class Server:
    """``with Server(folder) as s: s.url("model.pt")``; ``s.knobs`` changes its behaviour."""

    def __init__(self, root: str):
        self.knobs = Knobs()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(os.fspath(root), self.knobs))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, name: str = "") -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/{name}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
