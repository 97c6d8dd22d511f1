"""Fetching a dcgm-exporter's /metrics: one GET under a hard overall deadline, with the credentials and TLS
settings of a dcgm-exporter run with a web config (`--web-config-file`: basic auth, TLS, client
certificates), aborted cleanly when the source closes.

Secrets (the password, the token) are read from their files at every fetch, so a rotated Kubernetes Secret
is used at the next collection; TLS files are reloaded when they change. No secret is ever put in a
message: every message names the URL in its display form (no user info) and the setting and file to check.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import re
import socket
import ssl
import threading
import time
from urllib.parse import unquote, urlsplit, urlunsplit

MAX_BODY_BYTES = 16 * 2**20  # dcgm-exporter's output for 8 GPUs with every field is well under 1 MiB
MAX_SECRET_BYTES = 64 * 2**10  # a password or token file larger than this is not one

CLOSED = "dcgm_exporter_closed"
CREDENTIALS = "dcgm_exporter_credentials"
TLS = "dcgm_exporter_tls"
UNAUTHORIZED = "dcgm_exporter_unauthorized"
BAD_RESPONSE = "dcgm_exporter_bad_response"
_TOKEN = re.compile(r"[\x21-\x7e]+")  # one word of printable ASCII: what an Authorization header can carry
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,30}")


class ScrapeError(Exception):
    """The dcgm-exporter could not be read at all; `reason` becomes the source's error label."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def display_url(url: str) -> str:
    """The URL as logs and messages show it: without its user info (a user name and password)."""
    scheme, separator, rest = url.partition("://")
    if separator and at_outside_host(url):
        # a password with an unencoded '/', '?' or '#' ends the host part early: everything up to the last
        # '@' may be secret
        return f"{scheme}://{rest.rpartition('@')[2]}"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "the URL (not shown: it is not valid, and may hold credentials)"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def at_outside_host(url: str) -> bool:
    """Whether an '@' stands after the host part ends (at the first '/', '?' or '#'): a password written with
    one of those unencoded, which would make everything before the '@' look like a host and a path."""
    rest = url.partition("://")[2]
    return "@" in rest and "@" not in re.split(r"[/?#]", rest, maxsplit=1)[0]


def url_credentials(url: str) -> tuple[str, str] | None:
    """The user name and password written into the URL (`http://user:pw@host/`), percent-decoded; None
    without user info."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")


class Fetcher:
    """GETs one URL, abandoned after a hard overall deadline: a server that hangs, or trickles its
    headers or body a byte at a time, is cut off when the deadline passes, not when one read times out.

    The connection's socket is shut down by a timer thread, which wakes a read blocked in any phase (the
    TLS handshake included). `close()` (from another thread, when the daemon stops) aborts a request in
    flight the same way, and the cut-off answer is dropped (reason dcgm_exporter_closed), never returned
    as if complete; the socket itself is only closed by the thread that reads from it.
    """

    def __init__(
        self,
        url: str,
        *,
        basic_auth_username: str = "",
        basic_auth_password_file: str = "",
        bearer_token_file: str = "",
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        insecure_skip_verify: bool = False,
    ) -> None:
        self.display_url = display_url(url)
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # basic auth: from the URL (password held), or from the settings (password read at each fetch)
        in_url = url_credentials(url)
        self.url_credentials = in_url is not None  # the reader warns: a URL is shown in many places
        self._username, self._password = in_url or (basic_auth_username, None)
        self._password_file = basic_auth_password_file
        self._bearer_token_file = bearer_token_file
        self._tls_files = tuple((setting, path) for setting, path in (
            ("dcgm.ca_file", ca_file), ("dcgm.cert_file", cert_file), ("dcgm.key_file", key_file)) if path)
        self._ca_file, self._cert_file, self._key_file = ca_file, cert_file, key_file
        self._insecure = insecure_skip_verify
        self._context: ssl.SSLContext | None = None
        self._context_signature: tuple[tuple[int, int, int], ...] | None = None
        self._lock = threading.Lock()  # guards _sock, _closed
        self._sock: socket.socket | None = None
        self._closed = False

    def fetch(self, deadline: float) -> str:
        url = self.display_url
        if self._is_closed():
            raise ScrapeError(CLOSED, f"{url}: not fetched, the source is closing")
        headers = {"Accept": "text/plain"}
        authorization = self._authorization()
        if authorization:
            headers["Authorization"] = authorization
        context = self._tls_context() if self._https else None
        # always a plain connection: TLS is set up below, once close() and the deadline can cut it off
        connection = http.client.HTTPConnection(self._host, self._port, timeout=deadline)
        aborted = threading.Event()
        timer = threading.Timer(deadline, self._abort, (aborted,))
        timer.daemon = True
        timer.start()
        started = time.monotonic()
        shutter: socket.socket | None = None  # a second descriptor of the socket, for shutting it down
        try:
            connection.connect()
            assert connection.sock is not None
            shutter = connection.sock.dup()  # TLS takes over the socket object; this one stays usable
            with self._lock:
                if self._closed:
                    raise ScrapeError(CLOSED, f"{url}: not fetched, the source is closing")
                self._sock = shutter
            if aborted.is_set():  # the deadline passed while connecting
                raise TimeoutError
            if context is not None:
                connection.sock = context.wrap_socket(connection.sock, server_hostname=self._host)
            connection.request("GET", self._target, headers=headers)
            response = connection.getresponse()
            if response.status != 200:
                raise self._status_error(response.status, response.getheader("WWW-Authenticate", ""))
            chunks: list[bytes] = []
            size = 0
            while chunk := response.read1(65536):
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ScrapeError("dcgm_exporter_too_large", f"{url} sent more than {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
            # a shut-down socket reads as a clean end of the body: only these tell the two apart
            if self._is_closed():
                raise ScrapeError(CLOSED, f"{url}: the fetch was cut off, the source is closing; the "
                                  f"{size} bytes read are dropped")
            if aborted.is_set():
                raise TimeoutError
            if response.length:  # http.client ends a body cut short of its Content-Length silently
                raise ScrapeError(BAD_RESPONSE, f"{url} ended its answer after {size} of the {size + response.length} "
                                  "bytes its Content-Length announced; the partial answer is dropped")
        except ScrapeError:
            raise
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            raise self._failure(exc, aborted, shutter is not None, time.monotonic() - started, deadline) from None
        finally:
            timer.cancel()
            with self._lock:
                self._sock = None
            if shutter is not None:
                shutter.close()
            connection.close()
        return b"".join(chunks).decode("utf-8", errors="replace")

    def _failure(self, exc: BaseException, aborted: threading.Event, connected: bool, elapsed: float,
                 deadline: float) -> ScrapeError:
        url = self.display_url
        if self._is_closed():
            return ScrapeError(CLOSED, f"{url}: the fetch was cut off, the source is closing")
        if aborted.is_set() or isinstance(exc, TimeoutError):
            return ScrapeError("dcgm_exporter_timeout", f"{url} did not answer in full within {deadline:g}s "
                               f"(gave up after {elapsed:.1f}s)")
        if isinstance(exc, ssl.SSLCertVerificationError):
            return ScrapeError(TLS, f"TLS with {url} failed, its certificate is not trusted: "
                               f"{str(exc.verify_message).rstrip('.')}; "
                               "check dcgm.ca_file (the CA that signed dcgm-exporter's certificate; empty: the "
                               "system's CAs) and that the URL's host is named in the certificate")
        if isinstance(exc, ssl.SSLError):
            return ScrapeError(TLS, f"TLS with {url} failed: {exc.reason or exc}; check that dcgm-exporter serves "
                               "https at this address (its --web-config-file tls_server_config), and dcgm.cert_file "
                               "and dcgm.key_file if it asks for a client certificate")
        if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and not connected):
            return ScrapeError("dcgm_exporter_unreachable", f"cannot connect to {url}: {_os_text(exc)}: is "
                               "dcgm-exporter running on this node, and is dcgm.exporter_url its address?")
        return ScrapeError(BAD_RESPONSE, f"{url}: {exc.__class__.__name__}: {_os_text(exc)}")

    def _status_error(self, status: int, challenge: str) -> ScrapeError:
        url = self.display_url
        if status not in (401, 403):
            return ScrapeError("dcgm_exporter_http_error", f"{url} answered HTTP {status}")
        if self._bearer_token_file:
            check = f"the token in dcgm.bearer_token_file ({self._bearer_token_file})"
        elif self.url_credentials:
            check = ("the user name and password in dcgm.exporter_url (better kept in dcgm.basic_auth_username and "
                     "dcgm.basic_auth_password_file)")
        elif self._username:
            check = (f"dcgm.basic_auth_username and the password in dcgm.basic_auth_password_file "
                     f"({self._password_file}) against dcgm-exporter's web config (basic_auth_users)")
        else:
            scheme = challenge.split(None, 1)[0] if challenge.strip() else ""
            asks = f", it asks for {scheme} authentication" if _SCHEME.fullmatch(scheme) else ""
            return ScrapeError(UNAUTHORIZED, f"{url} answered HTTP {status}{asks} and no credentials were sent: set "
                               "dcgm.basic_auth_username and dcgm.basic_auth_password_file (dcgm-exporter's "
                               "--web-config-file basic_auth_users), or dcgm.bearer_token_file")
        if status == 401:
            return ScrapeError(UNAUTHORIZED, f"{url} rejected the credentials sent (HTTP 401): check {check}")
        return ScrapeError(UNAUTHORIZED, f"{url} refused access with the credentials sent (HTTP 403): check {check}, "
                           "and what it grants them (behind kube-rbac-proxy: the RBAC of the token's service account)")

    def _authorization(self) -> str:
        if self._bearer_token_file:
            token = _read_secret(self._bearer_token_file, "dcgm.bearer_token_file")
            if not _TOKEN.fullmatch(token):
                raise ScrapeError(CREDENTIALS, f"dcgm.bearer_token_file {self._bearer_token_file} holds no usable "
                                  "token: want one word of printable ASCII")
            return f"Bearer {token}"
        if not self._username:
            return ""
        password = self._password
        if password is None:
            password = _read_secret(self._password_file, "dcgm.basic_auth_password_file")
        return "Basic " + base64.b64encode(f"{self._username}:{password}".encode()).decode("ascii")

    def _tls_context(self) -> ssl.SSLContext:
        """The context for this fetch: built anew when a file it was built from has changed (cert-manager and
        Kubernetes Secrets replace them in place)."""
        signature = []
        for setting, path in self._tls_files:
            try:
                st = os.stat(path)
            except OSError as exc:
                raise ScrapeError(TLS, f"cannot read {setting} {path}: {_os_text(exc)}") from None
            signature.append((st.st_ino, st.st_mtime_ns, st.st_size))
        if self._context is None or tuple(signature) != self._context_signature:
            self._context = self._new_context()
            self._context_signature = tuple(signature)
        return self._context

    def _new_context(self) -> ssl.SSLContext:
        if self._insecure:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            try:
                context = ssl.create_default_context(cafile=self._ca_file or None)
            except (OSError, ssl.SSLError) as exc:
                raise ScrapeError(TLS, f"cannot load dcgm.ca_file {self._ca_file}: {_ssl_text(exc)} (want PEM "
                                  "certificates)") from None
        if self._cert_file:
            try:  # an encrypted key is refused, not prompted for on the terminal
                context.load_cert_chain(self._cert_file, self._key_file or None, password=_no_passphrase)
            except (OSError, ssl.SSLError, _EncryptedKey) as exc:
                raise ScrapeError(TLS, f"cannot load the client certificate dcgm.cert_file {self._cert_file} with "
                                  f"dcgm.key_file {self._key_file}: {_ssl_text(exc)} (want PEM, an unencrypted key "
                                  "that matches the certificate)") from None
        return context

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _abort(self, aborted: threading.Event | None = None) -> None:
        if aborted is not None:
            aborted.set()
        with self._lock:
            sock = self._sock
            if sock is not None:
                with contextlib.suppress(OSError):  # already closed by the reading thread
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._abort()


def _read_secret(path: str, setting: str) -> str:
    """A password or token from its file, surrounding whitespace (a final newline) removed. Errors name the
    file, never what it holds."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise ScrapeError(CREDENTIALS, f"cannot read {setting} {path}: {_os_text(exc)} (is the Secret "
                          "mounted?)") from None
    if len(data) > MAX_SECRET_BYTES:
        raise ScrapeError(CREDENTIALS, f"{setting} {path} is larger than {MAX_SECRET_BYTES} bytes: not a secret")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ScrapeError(CREDENTIALS, f"{setting} {path} is not UTF-8 text") from None
    if not text:
        raise ScrapeError(CREDENTIALS, f"{setting} {path} is empty")
    if not text.isprintable():
        raise ScrapeError(CREDENTIALS, f"{setting} {path} holds more than one line, or control characters")
    return text


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> str:
    raise _EncryptedKey("the key is encrypted, and there is no setting for its passphrase")


def _os_text(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or exc.__class__.__name__


def _ssl_text(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None):
        return str(exc.reason)
    return _os_text(exc)
