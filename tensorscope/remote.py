"""Remote model files: a `ByteSource` over ``https://``, ``hf://`` and ``s3://`` read by ranges.

`RemoteSource` has the local `ByteSource`'s interface (``path``, ``size``, ``view``, ``check``,
``read``, ``head``, ``close``, ``raw``) and fetches only the byte ranges the parsers ask for:

- **Block cache.** Fetched bytes land in a sparse anonymous map as large as the object (pages
  never written cost no memory), tracked per 4 KiB block (larger blocks past 64 GiB, so the
  block map stays under 16 MiB), so a range is fetched once and views
  stay zero-copy, numpy views included (``raw``; only bytes a `view` returned are valid there).
- **Coalesced, concurrent requests.** The missing blocks of one `view` (or of a `prefetch`
  list, e.g. every local header of a zip) are merged into runs (`plan_requests`: a hole is
  filled only when fetching it costs less time than one more request, `merge_gap` =
  `ROUND_TRIP` x `BANDWIDTH` / `WORKERS`, both settable), split at `MAX_REQUEST` and fetched by up to `WORKERS` threads.
- **Retries with backoff** on connection errors, timeouts, 5xx/429 and responses cut short.
- **A byte budget** (`DEFAULT_BUDGET`, or ``TENSORSCOPE_FETCH_BUDGET`` = ``512M``, ``4G`` ...):
  a read that would pass it is refused before it is made, with a message that says so.
- **The object must not change.** Every response's ETag / Last-Modified / total size is
  compared with the first one's; a difference is `RemoteChanged`, never a mixed listing.

Transports: ``http(s)://`` is spoken directly over `http.client` (keep-alive connections, one
per thread): the checks above need every status and header of every response, including the
misbehaving ones (a server that ignores Range, answers 416, redirects, cuts a body short), and
this keeps the plain install free of an async HTTP stack. TLS is verified against the system
store (``SSL_CERT_FILE`` honoured), an ``https`` -> ``http`` redirect is refused, the standard
proxy variables are honoured (CONNECT for https), errors are judged by status code
(docs/remote-transport.md). Every other scheme goes through fsspec
(``hf://`` via huggingface_hub's HfFileSystem, pinned to the commit the revision resolves to;
``s3://`` via s3fs, each ranged GET conditional on the first ETag; any other fsspec protocol
whose implementation is installed).

A server that ignores Range is read whole in one streamed response, only when the object fits
the budget (the counters say so); otherwise it is a `RemoteError` before anything is read.
"""
from __future__ import annotations

import mmap
import os
import posixpath
import random
import re
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import quote, urljoin, urlsplit

from .errors import TensorscopeError
from .source import check_range

if TYPE_CHECKING:   # imported where a pool is made: a local listing never needs one (nor logging)
    from concurrent.futures import ThreadPoolExecutor

__all__ = ["RemoteSource", "RemoteError", "RemoteChanged", "FetchBudgetExceeded", "is_url",
           "merge_gap", "plan_requests",
           "open_source", "totals", "add_totals", "reset_totals", "join", "dirname", "basename", "parse_budget",
           "DEFAULT_BUDGET"]

BLOCK_SHIFT = 12                 # 4 KiB cache blocks: a zip local header costs one page, not more
MAX_BLOCKS = 1 << 24             # bigger objects get bigger blocks: the block map stays <= 16 MiB
MAX_SIZE = 1 << 46               # 64 TiB: a larger size is a server's claim, not an object
HEAD_FETCH = 64 << 10            # the first request: sniffing head + most headers, one round trip
# The range planner's cost model: filling a hole of g bytes between two wanted runs costs g /
# BANDWIDTH seconds (and g billed bytes); leaving it costs one more request, and requests go out
# WORKERS at a time, so a request adds ROUND_TRIP / WORKERS. Holes are filled only while
# g < ROUND_TRIP * BANDWIDTH / WORKERS (`merge_gap`). Defaults: a user's link to a cloud bucket
# (S3/GCS/the Hub's CDN): 30 ms to the first byte, 100 Mbit/s (12.5 MB/s): holes under ~23 KB.
# Set TENSORSCOPE_ROUND_TRIP (seconds, "30ms") and TENSORSCOPE_BANDWIDTH (bytes per second,
# "12.5M", "1G") for another network.
ROUND_TRIP = 0.030               # seconds to first byte of a ranged GET
BANDWIDTH = 12_500_000           # bytes per second of one connection
MAX_REQUEST = 8 << 20            # split big reads so they go out concurrently
WORKERS = 16
MAX_GAP = int(ROUND_TRIP * BANDWIDTH / WORKERS)   # the hole filled at the defaults (`merge_gap`)
RETRIES = 4                      # attempts per request
BACKOFF = 0.1                    # seconds, doubled per attempt (+ jitter)
TIMEOUT = 30.0
MAX_REDIRECTS = 5
DEFAULT_BUDGET = 1 << 30         # bytes fetched per object before a read is refused
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux value; absent from Python < 3.13

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class RemoteError(TensorscopeError):
    """A remote object could not be read as asked (network, server behaviour, budget)."""

    def __init__(self, url: str, reason: str):
        self.url, self.reason = url, reason
        super().__init__(f"{url}: {reason}")


class RemoteChanged(RemoteError):
    """The object changed between two requests (ETag, Last-Modified or size differ)."""


class FetchBudgetExceeded(RemoteError):
    """Reading on would fetch more bytes than the budget allows."""


def is_url(path) -> bool:
    """True for ``scheme://...`` (``https://``, ``hf://``, ``s3://``; not ``file://``)."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


def parse_budget(text: str | None) -> int:
    """``"512M"``, ``"4G"``, ``"1000000"`` -> bytes (``None``/empty: `DEFAULT_BUDGET`)."""
    if not text:
        return DEFAULT_BUDGET
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise TensorscopeError(f"TENSORSCOPE_FETCH_BUDGET={text!r}: expected bytes like 512M or 4G")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


# -- the range planner -------------------------------------------------------------------------
def _knob(name: str, default: float, units: dict[str, float]) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in units:
        raise TensorscopeError(f"{name}={text!r}: expected a number with one of the units "
                               f"{', '.join(repr(u) for u in units if u) or 'none'}")
    value = float(m.group(1)) * units[unit]
    if not 0 < value < float("inf"):
        raise TensorscopeError(f"{name}={text!r}: must be positive")
    return value


def merge_gap(round_trip: float | None = None, bandwidth: float | None = None) -> int:
    """The largest hole (bytes) the planner fills between two wanted runs: what one more request
    costs in transfer time, ``round_trip * bandwidth / WORKERS`` (requests go out `WORKERS` at a
    time; defaults `ROUND_TRIP`, `BANDWIDTH`, or TENSORSCOPE_ROUND_TRIP / TENSORSCOPE_BANDWIDTH)."""
    rt = round_trip if round_trip is not None else _knob(
        "TENSORSCOPE_ROUND_TRIP", ROUND_TRIP, {"": 1.0, "s": 1.0, "ms": 1e-3})
    bw = bandwidth if bandwidth is not None else _knob(
        "TENSORSCOPE_BANDWIDTH", BANDWIDTH, {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9,
                                             "kb": 1e3, "mb": 1e6, "gb": 1e9})
    return max(0, int(rt * bw / WORKERS))


def plan_requests(runs, gap: int, max_request: int = MAX_REQUEST) -> list[tuple[int, int]]:
    """The requests ``[(start, end)]`` for the missing byte ``runs`` (any order, may overlap):
    runs whose hole is under ``gap`` bytes are joined (one request instead of two costs less
    than the hole's bytes), then every run is cut at ``max_request`` so big reads go out
    concurrently. A pure function: the tests hold each layout's bytes and requests to it."""
    runs = sorted((a, b) for a, b in runs if b > a)
    if not runs:
        return []
    merged = [list(runs[0])]
    for a, b in runs[1:]:
        if a - merged[-1][1] < gap or a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    jobs = []
    for a, b in merged:
        jobs += [(s, min(s + max_request, b)) for s in range(a, b, max_request)]
    return jobs


# -- URL paths (posix joins keep the scheme and host) ---------------------------------------------
def _split(url: str) -> tuple[str, str]:
    """(``scheme://host``-ish prefix, path) with any query string left on the path."""
    scheme, rest = url.split("://", 1)
    if scheme in ("http", "https"):
        host, _, path = rest.partition("/")
        return f"{scheme}://{host}", "/" + path
    return f"{scheme}://", rest


def dirname(url: str) -> str:
    prefix, path = _split(url)
    path = path.split("?", 1)[0]
    return prefix + posixpath.dirname(path)


def basename(url: str) -> str:
    return posixpath.basename(_split(url)[1].split("?", 1)[0])


def join(base: str, *names: str) -> str:
    prefix, path = _split(base)
    return prefix + posixpath.normpath(posixpath.join(path, *names))


# -- process-wide counters (what the CLI reports) -------------------------------------------------
_TOTALS = {"bytes": 0, "requests": 0, "objects": 0}
_TOTALS_LOCK = threading.Lock()


def totals() -> dict[str, int]:
    """Bytes fetched, requests made and remote objects opened by this process so far."""
    with _TOTALS_LOCK:
        return dict(_TOTALS)


def add_totals(nbytes: int, requests: int, objects: int) -> None:
    """Fold in what other processes (scan workers) fetched, so one process reports it all."""
    with _TOTALS_LOCK:
        _TOTALS["bytes"] += nbytes
        _TOTALS["requests"] += requests
        _TOTALS["objects"] += objects


_SEEN: dict[str, dict] = {}


def seen(url: str) -> dict | None:
    """``{"size", "version"}`` of the object at ``url`` when this process last opened it (a
    scan record says which version it judged without asking the server again)."""
    with _TOTALS_LOCK:
        return _SEEN.get(url)


def reset_totals() -> None:
    with _TOTALS_LOCK:
        for k in _TOTALS:
            _TOTALS[k] = 0


def _net_errors() -> tuple:
    """OSError and http.client's errors. http.client (with ssl and email) is imported on first
    use: ~30 ms of start-up that commands on local files never need."""
    import http.client
    return OSError, http.client.HTTPException


class _Retry(Exception):
    """A transient failure: try the request again (after a backoff)."""


# -- transports ---------------------------------------------------------------------------------
class _ProxyRefused(Exception):
    """The proxy answered CONNECT with another status than 200."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status} {reason}")
        self.status, self.reason = status, reason


def _shown_proxy(p) -> str:
    """A proxy URL without its credentials (messages never repeat a password)."""
    return f"{p.scheme}://{p.hostname or ''}{f':{p.port}' if p.port else ''}"


def _tls_context():
    """The system's trust store, or the one ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name (as curl,
    requests and OpenSSL itself take them): certificates and host names are always verified."""
    import ssl
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    return ssl.create_default_context(cafile=cafile, capath=capath)


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy URL for a request to ``host`` by the standard variables (``HTTPS_PROXY``,
    ``HTTP_PROXY``, either case; ``NO_PROXY`` hosts, domains and ``*`` go direct), or None."""
    import urllib.request
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme)
    if not proxy or urllib.request.proxy_bypass_environment(host, proxies):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def _proxy_auth(proxy) -> dict[str, str]:
    """``Proxy-Authorization`` for a proxy URL with ``user:password@``."""
    import base64
    from urllib.parse import unquote
    if proxy.username is None:
        return {}
    token = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
    return {"Proxy-Authorization": "Basic " + base64.b64encode(token).decode("ascii")}


def _https_through(proxy, auth: dict[str, str], netloc: str, timeout: float, context):
    """An HTTPS connection to ``netloc`` tunnelled through an HTTP proxy (CONNECT): the TLS
    session, and its certificate check, are end to end with the server, not the proxy. The
    proxy's answer is judged by its status code."""
    import http.client
    import socket

    class Tunnelled(http.client.HTTPSConnection):
        def connect(self):
            sock = socket.create_connection((proxy.hostname, proxy.port or 80), self.timeout)
            try:
                host = f"[{self.host}]" if ":" in self.host else self.host
                target = f"{host}:{self.port}"
                head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n" + "".join(
                    f"{k}: {v}\r\n" for k, v in auth.items()) + "\r\n"
                sock.sendall(head.encode("latin-1"))
                reader = sock.makefile("rb", buffering=0)
                line = reader.readline(65537)
                parts = line.decode("latin-1").split(None, 2)
                if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                    raise http.client.BadStatusLine(line)
                status = int(parts[1])
                while True:     # the proxy's headers, up to the blank line
                    h = reader.readline(65537)
                    if h in (b"\r\n", b"\n", b""):
                        break
                if status != 200:
                    raise _ProxyRefused(status, parts[2].strip() if len(parts) > 2 else "")
                self.sock = self._context.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise

    return Tunnelled(netloc, timeout=timeout, context=context)


class _HTTP:
    """Ranged GETs over http.client, one keep-alive connection per thread and host.

    TLS is verified against the system store (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured); a
    redirect from ``https://`` to ``http://`` is refused (the rest of the read would be in clear
    text, open to change on the way); ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` are honoured
    (CONNECT for https); every failure is judged by its status code, never by its text."""

    def __init__(self, url: str, timeout: float = TIMEOUT):
        self.url = url
        self.location = url          # after redirects (re-resolved from `url` if it stops working)
        self.timeout = timeout
        self._local = threading.local()
        self.identity: dict[str, str] = {}
        self._tls = None

    def _route(self, scheme: str, netloc: str):
        """(the request target's form: absolute for a plain-HTTP proxy, extra headers)."""
        host = urlsplit(f"//{netloc}").hostname or ""
        proxy = _proxy_for(scheme, host)
        return proxy, (_proxy_auth(urlsplit(proxy)) if proxy else {})

    def _conn(self, scheme: str, netloc: str):
        conns = self._local.__dict__.setdefault("conns", {})
        conn = conns.get((scheme, netloc))
        if conn is None:
            import http.client
            if scheme not in ("http", "https"):
                raise RemoteError(self.url, f"redirected to an unsupported scheme {scheme!r}")
            proxy, auth = self._route(scheme, netloc)
            if proxy is not None:
                p = urlsplit(proxy)
                if p.scheme != "http" or not p.hostname:
                    raise RemoteError(self.url, f"proxy {_shown_proxy(p)} is not an http:// proxy "
                                      "URL (HTTPS_PROXY/HTTP_PROXY): cannot use it")
            if scheme == "https":
                if self._tls is None:
                    self._tls = _tls_context()
                if proxy is not None:
                    conn = _https_through(urlsplit(proxy), auth, netloc, self.timeout, self._tls)
                else:
                    conn = http.client.HTTPSConnection(netloc, timeout=self.timeout,
                                                       context=self._tls)
            elif proxy is not None:   # plain HTTP: the proxy is sent the absolute URL
                p = urlsplit(proxy)
                conn = http.client.HTTPConnection(p.hostname, p.port or 80, timeout=self.timeout)
            else:
                conn = http.client.HTTPConnection(netloc, timeout=self.timeout)
            conn.proxied = proxy is not None and scheme == "http"
            conn.proxy_headers = auth if conn.proxied else {}
            conns[(scheme, netloc)] = conn
        return conn

    def _drop(self, scheme: str, netloc: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self._local.__dict__.get("conns", {}).values():
            conn.close()
        self._local = threading.local()

    def _get(self, start: int, end: int):
        """(response, url) for ``bytes=start..end-1``, redirects followed; the body is unread."""
        import ssl
        url = self.location
        # once on https (as asked, or redirected to), never back to clear text
        secure = "https" in (urlsplit(self.url).scheme.lower(), urlsplit(url).scheme.lower())
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            # names from a file (ONNX external data) may hold spaces: quote, keeping escapes
            target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~") + \
                (f"?{parts.query}" if parts.query else "")
            headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity",
                       "User-Agent": "tensorscope"}
            for fresh in (False, True):
                conn = self._conn(parts.scheme, parts.netloc)
                reused = conn.sock is not None
                try:
                    if conn.proxied:    # a plain-HTTP proxy is asked for the absolute URL
                        conn.request("GET", f"{parts.scheme}://{parts.netloc}{target}",
                                     headers={**headers, **conn.proxy_headers})
                    else:
                        conn.request("GET", target, headers=headers)
                    resp = conn.getresponse()
                    break
                except _ProxyRefused as e:
                    self._drop(parts.scheme, parts.netloc)
                    if e.status >= 500 or e.status == 429:
                        raise _Retry(f"the proxy answered CONNECT with {e}") from None
                    raise RemoteError(self.url, f"the proxy refused to connect to "
                                      f"{parts.netloc}: {e}") from None
                except ssl.SSLCertVerificationError as e:
                    self._drop(parts.scheme, parts.netloc)
                    raise RemoteError(self.url, f"TLS certificate of {parts.netloc} not trusted: "
                                      f"{e.verify_message or e.reason} (the system's trust store, "
                                      "or SSL_CERT_FILE)") from None
                except _net_errors() as e:
                    self._drop(parts.scheme, parts.netloc)
                    if reused and not fresh:
                        continue  # the server closed an idle keep-alive connection: reconnect
                    raise _Retry(f"{type(e).__name__}: {e}") from None
            if resp.status in (301, 302, 303, 307, 308):
                loc = resp.getheader("Location")
                resp.read()
                if not loc:
                    raise RemoteError(self.url, f"HTTP {resp.status} redirect without a Location")
                new = urljoin(url, loc)
                scheme = urlsplit(new).scheme.lower()
                if secure and scheme != "https":
                    # a downgrade: what follows would travel in clear text, open to change
                    raise RemoteError(self.url, f"HTTP {resp.status} redirect from {url} to "
                                      f"{new}: refusing to leave https:// for {scheme}://")
                secure = secure or scheme == "https"
                url = new
                continue
            if resp.will_close:
                self._local.__dict__.get("conns", {}).pop((parts.scheme, parts.netloc), None)
            self.location = url
            return resp, url
        raise RemoteError(self.url, f"more than {MAX_REDIRECTS} redirects")

    def _fail_status(self, resp, start: int, end: int):
        body = resp.read(200)
        resp.close()
        if resp.status >= 500 or resp.status == 429:
            raise _Retry(f"HTTP {resp.status} {resp.reason}")
        raise RemoteError(self.url, f"HTTP {resp.status} {resp.reason} for bytes {start}-{end - 1}"
                          + (f" ({body[:80]!r})" if body else ""))

    def _identity(self, resp) -> dict[str, str]:
        return {k: v for k in ("ETag", "Last-Modified") if (v := resp.getheader(k))}

    def stat(self, first: int, budget: int):
        """(size, first bytes, ranges honoured) from one ranged GET of ``[0, first)``."""
        resp, _ = self._get(0, first)
        self.identity = self._identity(resp)
        if resp.status == 206:
            total = _content_range(resp.getheader("Content-Range"))
            if total is None or total[0] != 0:
                resp.close()
                raise RemoteError(self.url, "HTTP 206 with an unusable Content-Range "
                                  f"{resp.getheader('Content-Range')!r}")
            size = total[2]
            want = min(first, size)
            if total[1] != want - 1:
                resp.close()
                raise RemoteError(self.url, f"asked for bytes 0-{first - 1}, the server sent "
                                  f"{resp.getheader('Content-Range')!r}")
            return size, _read_exact(resp, want, self.url, 0), True
        if resp.status == 416:
            total = _content_range(resp.getheader("Content-Range"))
            resp.read()
            if total is not None and total[2] == 0:
                return 0, b"", True  # an empty object: no byte can be asked for
            raise RemoteError(self.url, "HTTP 416 (range not satisfiable) for the first bytes of "
                              "the object: the server cannot serve byte ranges of it")
        if resp.status == 200:
            # Range ignored: the body is the whole object. Read it only within the budget.
            length = resp.getheader("Content-Length")
            if length is None or not length.isdigit():
                resp.close()
                raise RemoteError(self.url, "the server ignores HTTP Range requests and does not "
                                  "say the object's size: not downloading an unknown amount")
            size = int(length)
            if size > budget:
                resp.close()
                raise FetchBudgetExceeded(self.url, f"the server ignores HTTP Range requests, so "
                                          f"reading it means downloading all {size} bytes, over "
                                          f"the fetch budget of {budget} bytes (raise "
                                          "TENSORSCOPE_FETCH_BUDGET to allow it)")
            return size, resp, False
        self._fail_status(resp, 0, first)

    def fetch(self, start: int, end: int, size: int) -> bytes:
        resp, url = self._get(start, end)
        try:
            return self._fetched(resp, start, end, size)
        except (_Retry, RemoteError):
            parts = urlsplit(url)
            self._drop(parts.scheme, parts.netloc)
            raise

    def _fetched(self, resp, start: int, end: int, size: int) -> bytes:
        if resp.status == 206:
            total = _content_range(resp.getheader("Content-Range"))
            self._same(resp, total, size)
            if total[0] != start or total[1] != end - 1:
                resp.close()
                raise RemoteError(self.url, f"asked for bytes {start}-{end - 1}, the server sent "
                                  f"{resp.getheader('Content-Range')!r}")
            return _read_exact(resp, end - start, self.url, start)
        if resp.status == 200:
            resp.close()
            self._same(resp, None, size)
            raise RemoteError(self.url, f"the server ignored the Range request for bytes "
                              f"{start}-{end - 1} after honouring earlier ones: refusing to "
                              "download the whole object")
        if resp.status == 416:
            resp.read()
            raise RemoteChanged(self.url, f"HTTP 416 for bytes {start}-{end - 1} of an object "
                                f"that had {size} bytes: it changed (shrank) while being read")
        if resp.status == 412:
            resp.read()
            raise RemoteChanged(self.url, "the object changed while being read (HTTP 412)")
        self._fail_status(resp, start, end)

    def _same(self, resp, total, size: int) -> None:
        now = self._identity(resp)
        for key, before in self.identity.items():
            if now.get(key) != before:
                resp.close()
                raise RemoteChanged(self.url, f"the object changed while being read: {key} was "
                                    f"{before!r}, now {now.get(key)!r}")
        if total is not None and total[2] != size:
            resp.close()
            raise RemoteChanged(self.url, f"the object changed while being read: it had {size} "
                                f"bytes, now {total[2]}")


def _content_range(value: str | None) -> tuple[int, int, int] | None:
    """``bytes a-b/total`` -> (a, b, total); ``bytes */total`` -> (-1, -1, total)."""
    if not value:
        return None
    m = re.fullmatch(r"\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+)\s*", value)
    if not m:
        return None
    a, b, total = m.groups()
    return (int(a), int(b), int(total)) if a is not None else (-1, -1, int(total))


def _read_exact(resp, n: int, url: str, start: int) -> bytes:
    try:
        data = resp.read(n)
        extra = resp.read(1) if len(data) == n else b""
    except _net_errors() as e:
        resp.close()
        raise _Retry(f"response for bytes {start}-{start + n - 1} cut short ({e})") from None
    if len(data) < n:
        resp.close()
        raise _Retry(f"response for bytes {start}-{start + n - 1} cut short: {len(data)} of {n} "
                     "bytes")
    if extra:
        resp.close()
        raise RemoteError(url, f"the server sent more than the {n} bytes asked for at byte {start}")
    return data


class _FSSpec:
    """Any fsspec filesystem (``hf://``, ``s3://`` ...): ranged ``cat_file`` with identity checks."""

    def __init__(self, url: str):
        try:
            import fsspec
            fs, path = fsspec.core.url_to_fs(url)
        except ImportError as e:
            extra = {"hf": "hub", "s3": "s3"}.get(url.split("://", 1)[0], None)
            hint = f" (pip install 'tensorscope[{extra}]')" if extra else ""
            raise RemoteError(url, f"cannot read this kind of URL: {e}{hint}") from None
        except ValueError as e:
            raise RemoteError(url, f"not a readable URL: {e}") from None
        self.url, self.fs, self.path = url, fs, path
        self.protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        try:
            if self.protocol == "hf":
                self.path = _pin_hf(fs, path)
            info = fs.info(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{url}: no such object") from None
        except Exception as e:  # noqa: BLE001 — each backend has its own errors
            raise RemoteError(url, f"cannot stat the object: {type(e).__name__}: {e}") from None
        if info.get("type") == "directory":
            raise IsADirectoryError(f"{url}: is a folder")
        self.size = int(info["size"])
        self.etag = info.get("ETag") or info.get("etag")
        lfs = info.get("lfs") or {}
        self.identity = {k: v for k, v in (("ETag", self.etag), ("sha256", lfs.get("sha256")),
                                           ("blob_id", info.get("blob_id"))) if v}

    def stat(self, first: int, budget: int):
        return self.size, self.fetch(0, min(first, self.size), self.size) if self.size else b"", True

    def fetch(self, start: int, end: int, size: int) -> bytes:
        try:
            if self.protocol == "s3" and self.etag:
                data = self._s3_get(start, end)
            else:
                data = self.fs.cat_file(self.path, start=start, end=end)
        except (RemoteError, _Retry):
            raise
        except FileNotFoundError:
            raise RemoteChanged(self.url, "the object disappeared while being read") from None
        except Exception as e:  # noqa: BLE001
            text = f"{type(e).__name__}: {e}"
            status = _status_of(e)
            if status == 412:
                raise RemoteChanged(self.url, "the object changed while being read (its ETag "
                                    "no longer matches)") from None
            if status in (404, 410):
                raise RemoteChanged(self.url, "the object disappeared while being read "
                                    f"(HTTP {status})") from None
            if status is not None and 400 <= status < 500 and status != 429:
                raise RemoteError(self.url, f"HTTP {status} for bytes {start}-{end - 1}: "
                                  f"{text}") from None
            raise _Retry(text) from None   # 5xx, 429, or no status: the network
        if len(data) != end - start:
            raise _Retry(f"bytes {start}-{end - 1}: got {len(data)} of {end - start} bytes")
        return data

    def _s3_get(self, start: int, end: int) -> bytes:
        """A GET conditional on the first ETag, so a replaced object is an error, not a mix."""
        from fsspec.asyn import sync
        bucket, key, version = self.fs.split_path(self.path)

        async def get():
            kw = {"VersionId": version} if version else {}
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, IfMatch=self.etag,
                                          Range=f"bytes={start}-{end - 1}", **kw)
            try:
                return await resp["Body"].read()
            finally:
                resp["Body"].close()
        return sync(self.fs.loop, get)

    def close(self) -> None:
        pass


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status code behind a backend's exception, from the exception objects themselves
    (never their text): botocore's ``response`` dict (s3fs keeps the ClientError as the cause
    of the OSError it raises), a ``response.status_code`` (huggingface_hub, requests, httpx),
    aiohttp's ``status``, urllib's ``code``; the causes and contexts are searched in turn."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            code = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            return code
        for attr in ("status", "status_code", "code"):
            code = getattr(exc, attr, None)
            if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
                return code
        exc = exc.__cause__ or exc.__context__
    return None


def _pin_hf(fs, path: str) -> str:
    """``org/name@rev/file`` -> the same at the commit ``rev`` resolves to now, so the object
    cannot change under us between requests (commits are immutable)."""
    res = fs.resolve_path(path)
    if not hasattr(res, "repo_id"):
        return path  # a storage bucket, not a repository: no commits to pin to
    rev = res.revision
    if not (rev and re.fullmatch(r"[0-9a-f]{40}", rev)):
        rev = fs._api.repo_info(res.repo_id, revision=res.revision, repo_type=res.repo_type).sha
    prefix = "" if res.repo_type == "model" else f"{res.repo_type}s/"
    return f"{prefix}{res.repo_id}@{rev}/{res.path_in_repo}".rstrip("/")


# -- the source -------------------------------------------------------------------------------------
class RemoteSource:
    """A read-only remote object with the `ByteSource` interface, fetched by ranges on demand.

    Attributes:
        path: the URL as given.
        size: the object's size in bytes.
        bytes_fetched, requests: what reading it has cost so far.
        waits: how many times a read waited on requests (a batch of concurrent requests is one).
        budget: the most bytes this object may fetch.
    """

    def __init__(self, url: str, *, budget: int | None = None, first_fetch: int = HEAD_FETCH):
        """``first_fetch``: bytes asked for by the first request, which also learns the size and
        the version (1 when only those are wanted)."""
        self.path = url
        self.budget = parse_budget(os.environ.get("TENSORSCOPE_FETCH_BUDGET")) \
            if budget is None else budget
        self.bytes_fetched = 0
        self.requests = 0
        self.waits = 0          # times a read waited on the network: round trips in a row
        self.ranges_ok = True
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._readahead = 1
        self._last_fault = -2
        self._transport = _HTTP(url) if url.split("://", 1)[0].lower() in ("http", "https") \
            else _FSSpec(url)
        try:
            size, first, self.ranges_ok = self._retrying(
                lambda: self._transport.stat(first_fetch, self.budget), 0, first_fetch)
            if size > MAX_SIZE:
                raise RemoteError(url, f"the server says the object has {size} bytes: more than "
                                  f"any model file ({MAX_SIZE}), not believed")
            self.size = size
            self._shift = BLOCK_SHIFT
            while (size >> self._shift) > MAX_BLOCKS:
                self._shift += 1
            self._have = bytearray((size + (1 << self._shift) - 1) >> self._shift)
            # The cache: as large as the object, but pages never written take no memory.
            self._mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS |
                                 _MAP_NORESERVE) if size else None
        except (OSError, OverflowError) as e:
            self._transport.close()
            if isinstance(e, FileNotFoundError):
                raise
            raise RemoteError(url, f"cannot hold a cache of the object: {e}") from None
        except BaseException:
            self._transport.close()
            raise
        self._view = memoryview(self._mm).toreadonly() if self._mm is not None else memoryview(b"")
        with _TOTALS_LOCK:
            _TOTALS["objects"] += 1
            if len(_SEEN) > 4096:
                _SEEN.clear()
            _SEEN[url] = {"size": size, "version": self.version}
        if not self.ranges_ok:
            self._stream_whole(first)
        elif first:
            self._store(0, first)

    # -- accounting -----------------------------------------------------------------------------
    def _store(self, start: int, data: bytes) -> None:
        end = start + len(data)
        self._mm[start:end] = data
        shift = self._shift
        first, last = start >> shift, (end + (1 << shift) - 1) >> shift
        if end < self.size:
            last = end >> shift  # a trailing partial block is not complete
        self._have[first:last] = b"\x01" * (last - first)

    def _stream_whole(self, resp) -> None:
        """The whole body of a server that ignored Range, within the budget (checked in stat)."""
        pos = 0
        try:
            while pos < self.size:
                chunk = resp.read(min(1 << 20, self.size - pos))
                if not chunk:
                    break
                self._mm[pos:pos + len(chunk)] = chunk
                pos += len(chunk)
        except _net_errors() as e:
            raise RemoteError(self.path, f"whole-object download cut short at byte {pos}: {e}") \
                from None
        finally:
            resp.close()
        self._account(pos, 0)  # the request itself was counted by _retrying
        if pos < self.size:
            raise RemoteError(self.path, f"whole-object download cut short: {pos} of {self.size} "
                              "bytes (the server ignores Range, so nothing can be resumed)")
        self._have[:] = b"\x01" * len(self._have)

    def _account(self, nbytes: int, requests: int) -> None:
        with _TOTALS_LOCK:  # fetch threads count too
            self.bytes_fetched += nbytes
            self.requests += requests
            _TOTALS["bytes"] += nbytes
            _TOTALS["requests"] += requests

    def _retrying(self, call, start: int, end: int):
        delay = BACKOFF
        for attempt in range(RETRIES):
            try:
                out = call()
            except _Retry as e:
                self._account(0, 1)
                if attempt == RETRIES - 1:
                    raise RemoteError(self.path, f"bytes {start}-{end - 1}: {e} (gave up after "
                                      f"{RETRIES} attempts)") from None
                time.sleep(delay * (1 + random.random() / 2))
                delay *= 2
                continue
            except RemoteError:
                self._account(0, 1)
                raise
            n = len(out) if isinstance(out, (bytes, bytearray)) else \
                len(out[1]) if isinstance(out, tuple) and isinstance(out[1], bytes) else 0
            self._account(n, 1)
            return out
        raise AssertionError("unreachable")

    # -- fetching ------------------------------------------------------------------------------
    def _missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """Block-aligned byte runs of ``[start, end)`` not fetched yet."""
        have, runs, shift = self._have, [], self._shift
        b, stop = start >> shift, (end + (1 << shift) - 1) >> shift
        while b < stop:
            b = have.find(0, b, stop)
            if b < 0:
                break
            e = have.find(1, b, stop)
            e = stop if e < 0 else e
            runs.append((b << shift, min(e << shift, self.size)))
            b = e
        return runs

    def _ensure(self, ranges) -> None:
        """Fetch every missing block of ``ranges`` ((offset, length) pairs)."""
        runs = []
        for offset, length in ranges:
            if length > 0:
                runs += self._missing(offset, offset + length)
        if not runs:
            return
        jobs = plan_requests(runs, merge_gap())
        want = sum(b - a for a, b in jobs)
        if self.bytes_fetched + want > self.budget:
            raise FetchBudgetExceeded(self.path, f"reading bytes {jobs[0][0]}-{jobs[-1][1] - 1} "
                                      f"would fetch {want} more bytes after {self.bytes_fetched}, "
                                      f"over the fetch budget of {self.budget} bytes (raise "
                                      "TENSORSCOPE_FETCH_BUDGET to allow it)")

        self.waits += 1

        def one(job):
            a, b = job
            data = self._retrying(lambda: self._transport.fetch(a, b, self.size), a, b)
            return a, data

        if len(jobs) == 1:
            results = [one(jobs[0])]
        else:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor
                self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="tensorscope-fetch")
            results = list(self._pool.map(one, jobs))
        for a, data in results:
            self._store(a, data)

    def prefetch(self, ranges) -> None:
        """Fetch these ``(offset, length)`` ranges together (coalesced, concurrent): a hint from
        a parser that knows what it will read next. Ranges outside the object are ignored."""
        ranges = [(max(0, o), min(n, self.size - max(0, o))) for o, n in ranges if o < self.size]
        with self._lock:
            self._ensure(ranges)

    def cached(self, offset: int, length: int) -> bool:
        """True when ``[offset, offset + length)`` (clipped to the object) needs no request."""
        return not self._missing(max(0, offset), min(offset + length, self.size))

    # -- the ByteSource interface ---------------------------------------------------------------
    @property
    def raw(self):
        """What numpy views are made over: the cache, read-only, valid only where `view` has
        fetched. Not the `mmap` itself, so that nobody drops its pages (``MADV_DONTNEED`` on an
        anonymous map zeroes them: page releasers skip anything that is not a file map)."""
        return self._view

    def check(self, offset: int, length: int, what: str = "data", *, fmt: str = "",
              member: str | None = None) -> None:
        """Raise FormatError unless ``[offset, offset+length)`` lies inside the object (no fetch)."""
        check_range(self, offset, length, what, fmt=fmt, member=member)

    def view(self, offset: int, length: int, what: str = "data", *, fmt: str = "",
             member: str | None = None) -> memoryview:
        """The bytes, fetched if needed, as a read-only slice of the cache (no copy after)."""
        self.check(offset, length, what, fmt=fmt, member=member)
        if length:
            with self._lock:
                self._ensure([(offset, length)])
        return self._view[offset:offset + length]

    def read(self, offset: int, length: int, what: str = "data", **kw) -> bytes:
        return bytes(self.view(offset, length, what, **kw))

    def head(self, n: int = 64) -> bytes:
        return bytes(self.view(0, min(n, self.size)))

    def random_access(self) -> "LazyBuffer":
        """The whole object for parsers that hop through it (a protobuf walk): a sequence of
        bytes that fetches blocks as they are touched, with readahead on sequential access."""
        return LazyBuffer(self)

    def _fault(self, pos: int) -> None:
        block = pos >> self._shift
        if block in (self._last_fault, self._last_fault + 1) or \
                (0 < block - self._last_fault <= self._readahead):
            self._readahead = min(self._readahead * 2, 256)   # sequential: read further ahead
        else:
            self._readahead = 1
        self._last_fault = block
        n = min(self._readahead << self._shift, self.size - pos)
        with self._lock:
            self._ensure([(pos, n)])

    @property
    def version(self) -> str | None:
        """What identifies this version of the object: its ETag (or content hash, or
        Last-Modified), None when the server gives none."""
        ident = self._transport.identity
        return ident.get("ETag") or ident.get("sha256") or ident.get("blob_id") or \
            ident.get("Last-Modified")

    def cost(self) -> dict[str, int]:
        return {"bytes": self.bytes_fetched, "requests": self.requests}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        self._transport.close()
        try:
            self._view.release()
        except (BufferError, ValueError):
            pass
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                # numpy views still hold the map; it is freed with them
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSource({self.path!r}, size={self.size}, fetched={self.bytes_fetched})"


class LazyBuffer:
    """Indexing and slicing of a `RemoteSource` as if it were one bytes-like object."""

    __slots__ = ("_src", "_have", "_mm", "_len", "_shift")

    def __init__(self, src: RemoteSource):
        self._src, self._have, self._mm, self._len = src, src._have, src._view, src.size
        self._shift = src._shift

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self._len)
            if step != 1:
                raise ValueError("LazyBuffer slices take no step")
            return self._src.view(start, max(0, stop - start))
        if key < 0:
            key += self._len
        if not 0 <= key < self._len:
            raise IndexError("index out of range")
        if not self._have[key >> self._shift]:
            self._src._fault(key)
        return self._mm[key]


def open_source(path, *, budget: int | None = None):
    """A `RemoteSource` for a URL, the local `ByteSource` for anything else."""
    if is_url(path):
        return RemoteSource(path, budget=budget)
    from .source import ByteSource
    return ByteSource(path)


def list_files(url: str) -> list[str]:
    """Names of the files in a remote folder (``hf://org/name``, ``s3://bucket/prefix``), sorted;
    empty where the scheme cannot list (plain HTTP)."""
    if url.split("://", 1)[0].lower() in ("http", "https"):
        return []
    try:
        import fsspec
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.isdir(path):
            return []
        entries = fs.ls(path, detail=True)
    except (ImportError, OSError, ValueError):
        return []
    return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries
                  if e.get("type") == "file")


def with_cost(doc: dict) -> dict:
    """``doc`` plus ``"fetched": {"bytes", "requests", "objects"}`` when remote objects were read
    (the ``--json`` key that says what a remote listing cost); unchanged otherwise."""
    cost = totals()
    if cost["objects"]:
        doc["fetched"] = cost
    return doc


def cost_line() -> str | None:
    """One line for ``-v``: what reading remote objects cost, or None when nothing was remote."""
    cost = totals()
    if not cost["objects"]:
        return None
    def n(count: int, word: str) -> str:   # "1 request", "2 requests"
        return f"{count} {word}{'s' if count != 1 else ''}"
    return (f"fetched {n(cost['bytes'], 'byte')} in {n(cost['requests'], 'request')} from "
            f"{n(cost['objects'], 'remote object')}")
