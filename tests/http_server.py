"""Real HTTP servers on 127.0.0.1 for the remote-source tests and benchmarks.

`Server` serves a folder with RFC 7233 single-range support (206 + Content-Range, 416 past the
end), an ETag and Last-Modified per file, keep-alive, and knobs that make it misbehave on purpose:
``ignore_range`` (200 + the whole body), ``always_416``, ``redirect`` (paths under ``/r/`` answer
302 to the real path), ``cut_short`` (the body stops half way and the connection closes),
``change_after`` (the ETag changes after N requests), ``claimed_size`` (a Content-Range total
that lies), ``delay`` (seconds before each answer, to
model a real network). Counters: requests and body bytes sent.

`HubServer` speaks the part of the Hugging Face Hub's HTTP API that huggingface_hub's
``HfFileSystem`` uses to read a model repository: repository info by revision
(``/api/models/{repo}[/revision/{rev}]``: the commit ``sha`` a branch points at), tree listings
(``/api/models/{repo}/tree/{rev}[/{path}]``), ``paths-info``, and ``/{repo}/resolve/{rev}/{file}``
with Range, ``ETag`` and ``X-Repo-Commit``; unknown repositories, revisions and files answer 404
with the ``X-Error-Code`` the client maps to its exceptions. Each commit is a local folder;
`HubServer.commit` adds one and moves a branch to it. Point the real client at it with
``HF_ENDPOINT`` or fsspec's ``hf`` config (``endpoint``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


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


# -- a Hugging Face Hub look-alike ------------------------------------------------------------------
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".gguf", ".npy", ".npz", ".h5")


def _blob_oid(path: str) -> str:
    """git's blob id (what the hub calls a file's ``oid``)."""
    h = hashlib.sha1()
    h.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Repo:
    def __init__(self):
        self.commits: dict[str, str] = {}     # sha -> folder
        self.branches: dict[str, str] = {}    # name -> sha


def _hub_handler(hub: "HubServer"):
    knobs = hub.knobs

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def setup(self):
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        # -- answers --
        def _json(self, doc, status: int = 200) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _missing(self, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _count(self) -> None:
            with knobs.lock:
                knobs.requests += 1
            if knobs.delay:
                time.sleep(knobs.delay)

        # -- routing --
        def do_GET(self):  # noqa: N802
            self._count()
            self._route("GET", urlsplit(self.path))

        def do_HEAD(self):  # noqa: N802
            self._count()
            self._route("HEAD", urlsplit(self.path))

        def do_POST(self):  # noqa: N802
            self._count()
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            self._route("POST", urlsplit(self.path), form)

        def _route(self, method: str, url, form=None) -> None:
            parts = [unquote(p) for p in url.path.split("/")[1:]]
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id, rest = "/".join(parts[2:4]), parts[4:]
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._missing("RepoNotFound", f"Repository {repo_id} not found")
                if not rest or rest[0] == "revision":
                    return self._info(repo_id, repo, rest[1] if len(rest) > 1 else "main")
                if rest[0] == "tree" and len(rest) >= 2:
                    query = parse_qs(url.query)
                    recursive = query.get("recursive", ["False"])[0].lower() == "true"
                    return self._tree(repo, rest[1], "/".join(rest[2:]), recursive)
                if rest[0] == "paths-info" and len(rest) == 2 and method == "POST":
                    return self._paths_info(repo, rest[1], (form or {}).get("paths", []))
            elif len(parts) >= 5 and parts[2] == "resolve":
                repo_id = "/".join(parts[:2])
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._missing("RepoNotFound", f"Repository {repo_id} not found")
                return self._resolve(method, repo, parts[3], "/".join(parts[4:]))
            self.send_error(404)

        def _commit(self, repo: _Repo, rev: str) -> tuple[str, str] | None:
            sha = repo.branches.get(rev, rev)
            folder = repo.commits.get(sha)
            return None if folder is None else (sha, folder)

        def _info(self, repo_id: str, repo: _Repo, rev: str) -> None:
            found = self._commit(repo, rev)
            if found is None:
                return self._missing("RevisionNotFound", f"Invalid rev id: {rev}")
            sha, folder = found
            siblings = [{"rfilename": e["path"]} for e in hub.entries(folder, "", True)
                        if e["type"] == "file"]
            self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                        "siblings": siblings})

        def _tree(self, repo: _Repo, rev: str, path: str, recursive: bool) -> None:
            found = self._commit(repo, rev)
            if found is None:
                return self._missing("RevisionNotFound", f"Invalid rev id: {rev}")
            folder = found[1]
            if not os.path.isdir(os.path.join(folder, path)):
                return self._missing("EntryNotFound", f"{path} does not exist on {rev}")
            self._json(hub.entries(folder, path, recursive))

        def _paths_info(self, repo: _Repo, rev: str, paths: list[str]) -> None:
            found = self._commit(repo, rev)
            if found is None:
                return self._missing("RevisionNotFound", f"Invalid rev id: {rev}")
            folder = found[1]
            out = []
            for p in paths:
                full = os.path.join(folder, p)
                if os.path.isdir(full):
                    out.append({"type": "directory", "oid": "0" * 40, "path": p})
                elif os.path.isfile(full):
                    out.append(hub.entry(folder, p))
            self._json(out)

        def _resolve(self, method: str, repo: _Repo, rev: str, path: str) -> None:
            found = self._commit(repo, rev)
            if found is None:
                return self._missing("RevisionNotFound", f"Invalid rev id: {rev}")
            sha, folder = found
            full = os.path.join(folder, path)
            if not os.path.isfile(full):
                return self._missing("EntryNotFound", f"{path} does not exist on {rev}")
            entry = hub.entry(folder, path)
            etag = f'"{entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]}"'
            size = entry["size"]
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if m and int(m.group(1)) >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if m:
                start = int(m.group(1))
                end = min(size - 1, int(m.group(2))) if m.group(2) else size - 1
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                start, end = 0, size - 1
                self.send_response(200)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("ETag", etag)
            self.send_header("X-Repo-Commit", sha)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if method == "HEAD":
                return
            with open(full, "rb") as f:
                f.seek(start)
                left = end - start + 1
                try:
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        with knobs.lock:
                            knobs.bytes_sent += len(chunk)
                        self.wfile.write(chunk)
                        left -= len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

    return Handler


class HubServer:
    """``with HubServer() as hub: hub.commit("org/name", folder)``; ``hub.endpoint`` is what
    ``HF_ENDPOINT`` is set to."""

    def __init__(self):
        self.knobs = Knobs()
        self.repos: dict[str, _Repo] = {}
        self._entries: dict[tuple[str, str], dict] = {}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _hub_handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def commit(self, repo_id: str, folder, branch: str = "main") -> str:
        """Publish ``folder`` as a new commit of ``repo_id`` and point ``branch`` at it; its
        sha."""
        repo = self.repos.setdefault(repo_id, _Repo())
        sha = hashlib.sha1(f"{repo_id} {len(repo.commits)} {folder}".encode()).hexdigest()
        repo.commits[sha] = os.fspath(folder)
        repo.branches[branch] = sha
        return sha

    def entry(self, folder: str, path: str) -> dict:
        """A file's tree entry: git blob id, size, and LFS pointer data for model files."""
        key = (folder, path)
        if key not in self._entries:
            full = os.path.join(folder, path)
            e = {"type": "file", "oid": _blob_oid(full), "size": os.path.getsize(full),
                 "path": path}
            if path.endswith(LFS_SUFFIXES):
                e["lfs"] = {"oid": _sha256(full), "size": e["size"], "pointerSize": 134}
            self._entries[key] = e
        return self._entries[key]

    def entries(self, folder: str, path: str, recursive: bool) -> list[dict]:
        out = []
        base = os.path.join(folder, path)
        for name in sorted(os.listdir(base)):
            rel = f"{path}/{name}" if path else name
            if os.path.isdir(os.path.join(base, name)):
                out.append({"type": "directory", "oid": "0" * 40, "path": rel})
                if recursive:
                    out.extend(self.entries(folder, rel, True))
            else:
                out.append(self.entry(folder, rel))
        return out

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
