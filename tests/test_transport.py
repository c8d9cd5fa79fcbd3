"""The HTTP transport of `tensorscope.remote` against real servers on 127.0.0.1 (issue 24): an
HTTPS server with a certificate made here (trusted through ``SSL_CERT_FILE``, refused without it),
whose redirect to ``http://`` is refused; an HTTP proxy written here, through which URLs whose
host cannot resolve (``.invalid``) are fetched (absolute-URI GET for http, CONNECT for https);
``NO_PROXY``; errors judged by status code."""
from __future__ import annotations

import datetime
import ipaddress
import selectors
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import tensorscope
from http_server import Knobs, Server, _handler
from tensorscope import remote
from torch_oracle import FIXTURES

FILE = next(p for p in sorted((FIXTURES / "formats").glob("*.safetensors")))
HOST = "model.invalid"       # RFC 2606: never resolves; only the proxy knows where it is


@pytest.fixture(autouse=True)
def _no_ambient_proxy(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy",
                "https_proxy", "no_proxy", "all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(var, raising=False)


# -- a certificate authority and a server certificate, made for the test ------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    folder = tmp_path_factory.mktemp("pki")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tensorscope test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName(HOST), x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(leaf.public_bytes(pem) + key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return folder


class _HTTPS(Server):
    """http_server.Server over TLS, with ``/down/<name>`` redirecting to ``http_base + name``."""

    def __init__(self, root, certfile, http_base: str = ""):
        self.knobs = Knobs()
        base = _handler(str(root), self.knobs)

        class Handler(base):
            def do_GET(self):  # noqa: N802
                if self.path.startswith("/down/"):
                    self.send_response(302)
                    self.send_header("Location", http_base + self.path[len("/down/"):])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                super().do_GET()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certfile)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, name: str = "", host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.httpd.server_address[1]}/{name}"


def _names(url_or_path):
    with tensorscope.open(url_or_path) as m:
        return [(t.name, t.dtype, t.shape, t.byte_offset) for t in m.tensors]


def test_https_verified_through_ssl_cert_file(pki, monkeypatch):
    with _HTTPS(FILE.parent, pki / "server.pem") as s:
        monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))
        assert _names(s.url(FILE.name)) == _names(FILE)


def test_an_untrusted_certificate_is_a_clear_error_not_retried(pki, monkeypatch):
    with _HTTPS(FILE.parent, pki / "server.pem") as s:
        with pytest.raises(remote.RemoteError, match="certificate .* not trusted") as e:
            tensorscope.open(s.url(FILE.name))   # the system store does not know the test CA
        assert "gave up" not in str(e.value)     # judged at once: retrying cannot help
        assert s.knobs.requests == 0


def test_a_redirect_from_https_to_http_is_refused(pki, monkeypatch):
    with Server(FILE.parent) as plain:
        with _HTTPS(FILE.parent, pki / "server.pem", plain.url("")) as s:
            monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))
            with pytest.raises(remote.RemoteError, match="refusing to leave https:// for http://"):
                tensorscope.open(s.url(f"down/{FILE.name}"))
            assert plain.knobs.requests == 0   # not one byte asked for in clear text
            # a redirect that stays on https is followed
            assert _names(s.url(f"r/{FILE.name}")) == _names(FILE)


# -- a forward proxy, written here ---------------------------------------------------------------
class _Proxy:
    """An HTTP proxy on 127.0.0.1 that knows where ``model.invalid`` is: absolute-URI GETs are
    forwarded (http), CONNECT opens a tunnel (https). Records every request line."""

    def __init__(self, routes: dict[str, tuple[str, int]], refuse_connect: int | None = None):
        self.seen: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _where(self, netloc: str):
                host, _, port = netloc.rpartition(":")
                return routes.get(f"{host}:{port}") or routes.get(host)

            def do_GET(self):  # noqa: N802
                proxy.seen.append(f"GET {self.path}")
                parts = urlsplit(self.path)
                target = self._where(parts.netloc)
                if parts.scheme != "http" or target is None:
                    self.send_error(502)
                    return
                import http.client
                conn = http.client.HTTPConnection(*target, timeout=10)
                conn.request("GET", parts.path, headers={k: v for k, v in self.headers.items()
                                                         if k.lower() != "proxy-authorization"})
                resp = conn.getresponse()
                body = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)
                conn.close()

            def do_CONNECT(self):  # noqa: N802
                proxy.seen.append(f"CONNECT {self.path}")
                target = self._where(self.path)
                if refuse_connect or target is None:
                    self.send_response(refuse_connect or 502)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    self.close_connection = True
                    return
                up = socket.create_connection(target, timeout=10)
                self.send_response(200, "Connection established")
                self.end_headers()
                self.close_connection = True
                down = self.connection
                sel = selectors.DefaultSelector()   # (select() stops at descriptor 1024)
                sel.register(down, selectors.EVENT_READ)
                sel.register(up, selectors.EVENT_READ)
                try:
                    while True:
                        ready = sel.select(10)
                        if not ready:
                            return
                        for key, _ in ready:
                            data = key.fileobj.recv(65536)
                            if not data:
                                return
                            (up if key.fileobj is down else down).sendall(data)
                except OSError:
                    return
                finally:
                    sel.close()
                    up.close()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_an_unresolvable_host_is_fetched_through_the_http_proxy(monkeypatch):
    with Server(FILE.parent) as origin:
        port = origin.httpd.server_address[1]
        with _Proxy({HOST: ("127.0.0.1", port)}) as proxy:
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            url = f"http://{HOST}:{port}/{FILE.name}"
            assert _names(url) == _names(FILE)
            assert proxy.seen and all(line.startswith(f"GET http://{HOST}:{port}/")
                                      for line in proxy.seen)


def test_https_through_the_proxy_is_a_connect_tunnel_verified_end_to_end(pki, monkeypatch):
    with _HTTPS(FILE.parent, pki / "server.pem") as origin:
        port = origin.httpd.server_address[1]
        with _Proxy({HOST: ("127.0.0.1", port)}) as proxy:
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))
            assert _names(origin.url(FILE.name, host=HOST)) == _names(FILE)
            assert proxy.seen and all(line == f"CONNECT {HOST}:{port}" for line in proxy.seen)


def test_a_proxy_that_refuses_the_tunnel_is_judged_by_its_status(pki, monkeypatch):
    with _Proxy({}, refuse_connect=403) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        with pytest.raises(remote.RemoteError, match="proxy refused .* HTTP 403") as e:
            tensorscope.open(f"https://{HOST}/x.safetensors")
        assert "gave up" not in str(e.value)
        assert proxy.seen == [f"CONNECT {HOST}:443"]


def test_no_proxy_hosts_go_direct(monkeypatch):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))    # a port nobody listens on: the proxy, if it were used
    with Server(FILE.parent) as origin:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead.getsockname()[1]}")
        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
        assert _names(origin.url(FILE.name)) == _names(FILE)
    dead.close()


def test_status_codes_not_text_decide_what_a_backend_error_means():
    """s3fs raises OSError(EINVAL) for a failed If-Match; the ClientError behind it says 412."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    def boto(code: str, status: int):
        return translate_boto_error(ClientError({"Error": {"Code": code, "Message": "m"},
                                                 "ResponseMetadata": {"HTTPStatusCode": status}},
                                                "GetObject"))
    assert remote._status_of(boto("PreconditionFailed", 412)) == 412
    assert remote._status_of(boto("InternalError", 500)) == 500
    # a message that merely contains the digits is not a status
    assert remote._status_of(OSError("bytes 412-900: connection reset")) is None


def test_a_server_error_is_retried_a_client_error_is_not(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"x" * 100)
    with Server(tmp_path) as s:
        with pytest.raises(remote.RemoteError, match="HTTP 404"):
            remote.RemoteSource(s.url("missing.bin"))
        assert s.knobs.requests == 1       # a 404 is not retried
