"""Fetching a dcgm-exporter run as deployed: with a web config (`--web-config-file`: basic auth, TLS, client
certificates) or behind a proxy that wants a bearer token, and stopped mid-answer. Real servers on loopback
(DcgmExporterServer), certificates from a private CA made by trustme, and the real daemon where it is cheap.

No password or token may show in any log line, at any level, or on /metrics."""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trustme
from conftest import live_server, quick_config, value, wait_for
from dcgm_exporter_server import DcgmExporterServer, ExporterGpu

from exporter.config import ConfigError
from exporter.sources.base import SourceError
from exporter.sources.dcgm import fetch
from exporter.sources.dcgm.source import DcgmSource
from exporter.sources.nvml.simulated import SimulatedGpus

USER = "gpu-reader"
PASSWORD = "pw-7f3a-SECRET-d91c"
TOKEN = "tok-9c1e-BEARER-44ab"
SECRETS = (PASSWORD, TOKEN, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
PROF = {"DCGM_FI_PROF_SM_ACTIVE": 0.8, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.6, "DCGM_FI_PROF_DRAM_ACTIVE": 0.3}


@contextmanager
def exporter(sim: SimulatedGpus | None = None, **options: object) -> Iterator[DcgmExporterServer]:
    server = DcgmExporterServer(**options).start()  # type: ignore[arg-type]
    sim = sim or SimulatedGpus(1)
    server.serve([ExporterGpu(str(i), sim.uuid(i), PROF) for i in range(sim.count)])
    try:
        yield server
    finally:
        server.stop()


def config(url: str, **dcgm: object):  # type: ignore[no-untyped-def]
    return quick_config(dcgm={"enabled": True, "mode": "exporter", "exporter_url": url, "interval": "100ms",
                              "timeout": "2s", **dcgm})


def errors(text: str, reason: str) -> float:
    return value(text, "goodput_exporter_source_errors_total", source="dcgm", reason=reason) or 0


def with_credentials(url: str, user: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest}"


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every captured record, formatted, tracebacks included, and each message again on its own."""
    return caplog.text + "\n".join(record.getMessage() for record in caplog.records)


@pytest.fixture
def debug_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)  # the root logger and so every logger: uvicorn, httpx, ours
    return caplog


@pytest.fixture
def secret_files(tmp_path: Path) -> tuple[Path, Path]:
    password, token = tmp_path / "password", tmp_path / "token"
    password.write_text(PASSWORD + "\n")  # as `kubectl create secret --from-file` of an echoed file holds it
    token.write_text(TOKEN)
    return password, token


class Pki:
    """A private CA, a server certificate for 127.0.0.1 signed by it, a client certificate, and a second CA
    that signed neither."""

    def __init__(self, root: Path) -> None:
        ca, other = trustme.CA(), trustme.CA()
        self.ca_file, self.other_ca_file = str(root / "ca.pem"), str(root / "other-ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        other.cert_pem.write_to_path(self.other_ca_file)
        self.server_cert, self.server_key = self._issue(ca, root, "server", "127.0.0.1")
        self.localhost_cert, self.localhost_key = self._issue(ca, root, "localhost", "localhost")
        self.client_cert, self.client_key = self._issue(ca, root, "client", "goodput-exporter@node-7")

    @staticmethod
    def _issue(ca: trustme.CA, root: Path, name: str, *identities: str) -> tuple[str, str]:
        issued = ca.issue_cert(*identities)
        cert, key = root / f"{name}.pem", root / f"{name}.key"
        issued.cert_chain_pems[0].write_to_path(str(cert))
        issued.private_key_pem.write_to_path(str(key))
        return str(cert), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def failure(fetcher: fetch.Fetcher, deadline: float = 5.0) -> fetch.ScrapeError:
    with pytest.raises(fetch.ScrapeError) as info:
        fetcher.fetch(deadline)
    assert_no_secret(str(info.value))
    return info.value


# --- basic auth -----------------------------------------------------------------------------------------------


def test_basic_auth_from_the_settings_is_sent_re_read_and_never_shown(
        debug_log: pytest.LogCaptureFixture, secret_files: tuple[Path, Path]) -> None:
    password_file, _ = secret_files
    sim = SimulatedGpus(1)
    with exporter(sim, basic_auth=(USER, PASSWORD)) as server, live_server(config(
            server.url, basic_auth_username=USER, basic_auth_password_file=str(password_file)), backend=sim) as live:
        live.metrics_when("goodput_gpu_sm_active_ratio", 0.8, gpu="0")
        password_file.write_text("not-" + PASSWORD)  # the Secret rotated to a password the server refuses
        wait_for(lambda: errors(live.metrics(), "dcgm_exporter_unauthorized") >= 1)
        text = live.metrics()
        assert value(text, "goodput_exporter_source_up", source="dcgm") == 0
        assert value(text, "goodput_gpu_sm_active_ratio", gpu="0") is None
        password_file.write_text(PASSWORD)  # and back: read again at the next collection, no restart
        text = live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
        assert_no_secret(text)
    assert server.authorization[0].startswith("Basic ")
    assert "dcgm_exporter_unauthorized" in logged(debug_log)
    assert "dcgm.basic_auth_password_file" in logged(debug_log)  # the message says what to check
    assert_no_secret(logged(debug_log))


def test_basic_auth_missing_or_wrong_is_unauthorized_naming_the_settings(secret_files: tuple[Path, Path]) -> None:
    password_file, _ = secret_files
    with exporter(basic_auth=(USER, PASSWORD)) as server:
        none = failure(fetch.Fetcher(server.url))
        assert none.reason == "dcgm_exporter_unauthorized"
        assert "no credentials were sent" in str(none) and "it asks for Basic" in str(none)
        assert "dcgm.basic_auth_username" in str(none)
        wrong_user = failure(fetch.Fetcher(server.url, basic_auth_username="someone",
                                           basic_auth_password_file=str(password_file)))
        assert wrong_user.reason == "dcgm_exporter_unauthorized"
        assert "HTTP 401" in str(wrong_user) and "dcgm.basic_auth_username" in str(wrong_user)
        assert server.authorization[0] == ""
        assert server.authorization[1].startswith("Basic ")


def test_credentials_in_the_url_are_sent_with_a_warning_and_never_shown(debug_log: pytest.LogCaptureFixture) -> None:
    sim = SimulatedGpus(1)
    with exporter(sim, basic_auth=(USER, PASSWORD)) as server:
        url = with_credentials(server.url, USER, PASSWORD)
        with live_server(config(url), backend=sim) as live:
            text = live.metrics_when("goodput_gpu_sm_active_ratio", 0.8, gpu="0")
            assert_no_secret(text)
    warnings = [r.getMessage() for r in debug_log.records if r.levelno == logging.WARNING]
    assert any("dcgm.basic_auth_password_file" in w and "dcgm.exporter_url" in w for w in warnings), warnings
    # the server is gone: the daemon's next messages name the URL, in its display form
    with live_server(config(url), backend=sim) as live:
        wait_for(lambda: errors(live.metrics(), "dcgm_exporter_unreachable") >= 1)
        assert_no_secret(live.metrics())
    assert server.url in logged(debug_log)
    assert_no_secret(logged(debug_log))


def test_url_credentials_are_percent_decoded() -> None:
    password = "p@ss:w/rd%"  # each a character with a meaning in a URL
    with exporter(basic_auth=(USER, password)) as server:
        encoded = with_credentials(server.url, USER, "p%40ss%3Aw%2Frd%25")
        fetcher = fetch.Fetcher(encoded)
        assert "DCGM_FI_PROF_SM_ACTIVE" in fetcher.fetch(5.0)
        assert fetcher.display_url == server.url
        wrong = failure(fetch.Fetcher(with_credentials(server.url, USER, "p%40ss")))
        assert wrong.reason == "dcgm_exporter_unauthorized" and "dcgm.exporter_url" in str(wrong)
        assert "p%40ss" not in str(wrong)


def test_a_missing_or_empty_password_file_is_a_credentials_error_naming_the_file(
        debug_log: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    sim = SimulatedGpus(1)
    missing = tmp_path / "not-mounted" / "password"
    with exporter(sim, basic_auth=(USER, PASSWORD)) as server:
        error = failure(fetch.Fetcher(server.url, basic_auth_username=USER, basic_auth_password_file=str(missing)))
        assert error.reason == "dcgm_exporter_credentials"
        assert str(missing) in str(error) and "dcgm.basic_auth_password_file" in str(error)
        with live_server(config(server.url, basic_auth_username=USER, basic_auth_password_file=str(missing)),
                         backend=sim) as live:
            wait_for(lambda: errors(live.metrics(), "dcgm_exporter_credentials") >= 1)
            assert value(live.metrics(), "goodput_exporter_source_up", source="dcgm") == 0
            missing.parent.mkdir()
            missing.write_text(PASSWORD)  # mounted late: taken at the next collection
            live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
        assert server.requests >= 1
        empty = tmp_path / "empty"
        empty.write_text("\n")
        error = failure(fetch.Fetcher(server.url, basic_auth_username=USER, basic_auth_password_file=str(empty)))
        assert error.reason == "dcgm_exporter_credentials" and "is empty" in str(error)
        two_lines = tmp_path / "two-lines"
        two_lines.write_text(f"{PASSWORD}\n{PASSWORD}\n")
        error = failure(fetch.Fetcher(server.url, basic_auth_username=USER, basic_auth_password_file=str(two_lines)))
        assert error.reason == "dcgm_exporter_credentials" and "more than one line" in str(error)
    assert str(missing) in logged(debug_log)
    assert_no_secret(logged(debug_log))


# --- bearer token ---------------------------------------------------------------------------------------------


def test_bearer_token_is_sent_re_read_and_never_shown(
        debug_log: pytest.LogCaptureFixture, secret_files: tuple[Path, Path]) -> None:
    _, token_file = secret_files
    sim = SimulatedGpus(1)
    with exporter(sim, bearer_token=TOKEN) as server, live_server(
            config(server.url, bearer_token_file=str(token_file)), backend=sim) as live:
        live.metrics_when("goodput_gpu_sm_active_ratio", 0.8, gpu="0")
        token_file.write_text("expired-" + TOKEN)
        wait_for(lambda: errors(live.metrics(), "dcgm_exporter_unauthorized") >= 1)
        assert value(live.metrics(), "goodput_exporter_source_up", source="dcgm") == 0
        token_file.write_text(TOKEN + "\n")  # the projected token renewed
        text = live.metrics_when("goodput_exporter_source_up", 1, source="dcgm")
        assert_no_secret(text)
    assert server.authorization[0] == f"Bearer {TOKEN}"
    assert "dcgm.bearer_token_file" in logged(debug_log)
    assert_no_secret(logged(debug_log))


def test_bearer_token_missing_or_wrong_is_unauthorized_naming_the_setting(
        secret_files: tuple[Path, Path], tmp_path: Path) -> None:
    _, token_file = secret_files
    with exporter(bearer_token=TOKEN) as server:
        none = failure(fetch.Fetcher(server.url))
        assert none.reason == "dcgm_exporter_unauthorized" and "dcgm.bearer_token_file" in str(none)
        token_file.write_text("some-other-token")
        wrong = failure(fetch.Fetcher(server.url, bearer_token_file=str(token_file)))
        assert wrong.reason == "dcgm_exporter_unauthorized"
        assert f"dcgm.bearer_token_file ({token_file})" in str(wrong)
        spaced = tmp_path / "spaced"
        spaced.write_text("two words")
        error = failure(fetch.Fetcher(server.url, bearer_token_file=str(spaced)))
        assert error.reason == "dcgm_exporter_credentials" and str(spaced) in str(error)
        assert "two words" not in str(error)
        gone = failure(fetch.Fetcher(server.url, bearer_token_file=str(tmp_path / "gone")))
        assert gone.reason == "dcgm_exporter_credentials" and "dcgm.bearer_token_file" in str(gone)


# --- TLS ------------------------------------------------------------------------------------------------------


def test_https_with_the_ca_file_is_read_by_the_daemon(pki: Pki, debug_log: pytest.LogCaptureFixture) -> None:
    sim = SimulatedGpus(1)
    with exporter(sim, certfile=pki.server_cert, keyfile=pki.server_key) as server:
        assert server.url.startswith("https://")
        with live_server(config(server.url, ca_file=pki.ca_file), backend=sim) as live:
            live.metrics_when("goodput_gpu_sm_active_ratio", 0.8, gpu="0")
        with live_server(config(server.url), backend=sim) as live:  # the system's CAs do not know ours
            wait_for(lambda: errors(live.metrics(), "dcgm_exporter_tls") >= 1)
            assert value(live.metrics(), "goodput_exporter_source_up", source="dcgm") == 0
    assert "dcgm.ca_file" in logged(debug_log)


def test_https_without_our_ca_is_a_tls_error_and_insecure_skip_verify_reads_it(pki: Pki) -> None:
    with exporter(certfile=pki.server_cert, keyfile=pki.server_key) as server:
        for fetcher in (fetch.Fetcher(server.url), fetch.Fetcher(server.url, ca_file=pki.other_ca_file)):
            error = failure(fetcher)
            assert error.reason == "dcgm_exporter_tls"
            assert "not trusted" in str(error) and "dcgm.ca_file" in str(error)
        assert "DCGM_FI_PROF_SM_ACTIVE" in fetch.Fetcher(server.url, insecure_skip_verify=True).fetch(5.0)
        assert server.handshake_failures == 2
        # plain http to a TLS server, and TLS to a plain one: errors, never a reading
        assert failure(fetch.Fetcher(server.url.replace("https://", "http://"))).reason == "dcgm_exporter_bad_response"
    with exporter() as plain:
        error = failure(fetch.Fetcher(plain.url.replace("http://", "https://"), ca_file=pki.ca_file))
        assert error.reason == "dcgm_exporter_tls" and "WRONG_VERSION_NUMBER" in str(error)


def test_a_certificate_for_another_host_is_a_tls_error_unless_verification_is_off(pki: Pki) -> None:
    with exporter(certfile=pki.localhost_cert, keyfile=pki.localhost_key) as server:  # URL says 127.0.0.1
        error = failure(fetch.Fetcher(server.url, ca_file=pki.ca_file))
        assert error.reason == "dcgm_exporter_tls" and "127.0.0.1" in str(error)
        assert "DCGM_FI" in fetch.Fetcher(server.url, ca_file=pki.ca_file, insecure_skip_verify=True).fetch(5.0)
        localhost = server.url.replace("127.0.0.1", "localhost")
        assert "DCGM_FI" in fetch.Fetcher(localhost, ca_file=pki.ca_file).fetch(5.0)


def test_a_replaced_ca_file_is_used_at_the_next_fetch(pki: Pki, tmp_path: Path) -> None:
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(Path(pki.other_ca_file).read_bytes())
    with exporter(certfile=pki.server_cert, keyfile=pki.server_key) as server:
        fetcher = fetch.Fetcher(server.url, ca_file=str(ca_file))
        assert failure(fetcher).reason == "dcgm_exporter_tls"
        ca_file.write_bytes(Path(pki.ca_file).read_bytes() + b"\n")  # cert-manager wrote the right bundle
        assert "DCGM_FI" in fetcher.fetch(5.0)
        ca_file.unlink()
        error = failure(fetcher)
        assert error.reason == "dcgm_exporter_tls" and f"dcgm.ca_file {ca_file}" in str(error)


def test_client_certificate_with_basic_auth_through_the_daemon(
        pki: Pki, debug_log: pytest.LogCaptureFixture, secret_files: tuple[Path, Path]) -> None:
    password_file, _ = secret_files
    sim = SimulatedGpus(1)
    tls = {"ca_file": pki.ca_file, "cert_file": pki.client_cert, "key_file": pki.client_key}
    with exporter(sim, basic_auth=(USER, PASSWORD), certfile=pki.server_cert, keyfile=pki.server_key,
                  client_ca_file=pki.ca_file) as server:
        with live_server(config(server.url, basic_auth_username=USER, basic_auth_password_file=str(password_file),
                                **tls), backend=sim) as live:
            assert_no_secret(live.metrics_when("goodput_gpu_sm_active_ratio", 0.8, gpu="0"))
        no_cert = failure(fetch.Fetcher(server.url, ca_file=pki.ca_file, basic_auth_username=USER,
                                        basic_auth_password_file=str(password_file)))
        assert no_cert.reason == "dcgm_exporter_tls" and "dcgm.cert_file" in str(no_cert)
        wrong_key = failure(fetch.Fetcher(server.url, ca_file=pki.ca_file, cert_file=pki.client_cert,
                                          key_file=pki.server_key))
        assert wrong_key.reason == "dcgm_exporter_tls" and pki.server_key in str(wrong_key)
    assert_no_secret(logged(debug_log))


# --- shutdown and short answers -------------------------------------------------------------------------------


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("content_length", [True, False], ids=["content-length", "until-close"])
def test_close_during_a_slow_body_drops_it_as_closed(pki: Pki, https: bool, content_length: bool) -> None:
    options = {"certfile": pki.server_cert, "keyfile": pki.server_key} if https else {}
    with exporter(SimulatedGpus(8), **options) as server:
        server.content_length = content_length
        server.stall_body.set()  # half the body, then nothing until released
        fetcher = fetch.Fetcher(server.url, ca_file=pki.ca_file if https else "")
        outcome: list[object] = []

        def read() -> None:
            try:
                outcome.append(fetcher.fetch(60.0))
            except fetch.ScrapeError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=read)
        worker.start()
        assert server.body_stalled.wait(10)
        time.sleep(0.1)  # the client is in its read of the rest
        started = time.monotonic()
        fetcher.close()
        worker.join(10)
        assert not worker.is_alive() and time.monotonic() - started < 5.0
        assert len(outcome) == 1 and isinstance(outcome[0], fetch.ScrapeError), outcome
        assert outcome[0].reason == "dcgm_exporter_closed"
        assert failure(fetcher).reason == "dcgm_exporter_closed"  # closed for good: no new connection
        assert server.requests == 1


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_a_body_shorter_than_its_content_length_is_a_bad_response(pki: Pki, https: bool) -> None:
    options = {"certfile": pki.server_cert, "keyfile": pki.server_key} if https else {}
    with exporter(SimulatedGpus(8), **options) as server:
        server.short_body.set()
        error = failure(fetch.Fetcher(server.url, ca_file=pki.ca_file if https else ""))
        assert error.reason == "dcgm_exporter_bad_response"
        assert f"of the {len(server.body.encode())} bytes its Content-Length announced" in str(error)


def test_the_source_closed_mid_body_reports_closed_and_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sim = SimulatedGpus(2)
    with exporter(sim) as server:
        server.stall_body.set()
        source = DcgmSource(config(server.url, timeout="60s").dcgm, nvml_enabled=False)
        outcome: list[object] = []

        def collect() -> None:
            try:
                outcome.append(source.collect())
            except SourceError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=collect)
        worker.start()
        assert server.body_stalled.wait(10)
        time.sleep(0.1)
        source.close()  # the daemon stopping
        worker.join(10)
        assert not worker.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], SourceError), outcome
    assert outcome[0].reason == "dcgm_exporter_closed"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_daemon_stopped_mid_body_parses_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sim = SimulatedGpus(1)
    with exporter(sim) as server:
        with live_server(config(server.url, timeout="20s"), backend=sim) as live:
            live.metrics_when("goodput_gpu_sm_active_ratio", 0.8, gpu="0")
            server.stall_body.set()
            server.body_stalled.clear()
            assert server.body_stalled.wait(10)
            stopping = len(caplog.records)
        # stop() gives the collection 2 s, then closes the source: the fetch is cut off and dropped
        wait_for(lambda: any("dcgm_exporter_closed" in r.getMessage() for r in caplog.records[stopping:]))
    after = [(r.name, r.getMessage()) for r in caplog.records[stopping:] if r.levelno >= logging.WARNING]
    # no warning at all: no rejected series, no GPU "no longer reported", no "source down" from the runner
    assert after == []


# --- settings -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dcgm", "expected"), [
    ({"basic_auth_username": USER}, "go together"),
    ({"basic_auth_password_file": "/run/secrets/password"}, "go together"),
    ({"basic_auth_username": USER, "basic_auth_password_file": "/p", "bearer_token_file": "/t"}, "keep one"),
    ({"exporter_url": f"http://{USER}:{PASSWORD}@127.0.0.1:9400/metrics", "bearer_token_file": "/t"},
     "take them out of the URL"),
    ({"exporter_url": "https://127.0.0.1:9400/metrics", "cert_file": "/c.pem"}, "go together"),
    ({"ca_file": "/ca.pem"}, "dcgm.ca_file: TLS settings, and dcgm.exporter_url is http://"),
    ({"insecure_skip_verify": True}, "dcgm.insecure_skip_verify: TLS settings"),
    ({"basic_auth_username": "a:b", "basic_auth_password_file": "/p"}, "no colon"),
    ({"exporter_url": f"http://{USER}:{PASSWORD}@127.0.0.1:99999/metrics"},
     "'http://127.0.0.1:99999/metrics' (its user info not shown): Port out of range"),
    ({"exporter_url": f"http://{USER}:{PASSWORD}@/metrics"}, "(its user info not shown) names no host"),
    ({"exporter_url": f"http://{USER}:{PASSWORD} x@127.0.0.1/metrics"}, "(its user info not shown) is not an http"),
    ({"exporter_url": f"http://{USER}:{PASSWORD}@[::1/metrics"}, "the URL (not shown: it is not valid"),
    # a password with an unencoded '/' or '?' ends the host part early: nothing before the '@' is shown
    ({"exporter_url": f"http://{USER}:{PASSWORD}/x@127.0.0.1:9400/metrics"}, "an '@' outside its host part"),
    ({"exporter_url": f"http://{USER}:9400?{PASSWORD}@127.0.0.1:9400/metrics"}, "must be percent-encoded"),
])
def test_settings_that_cannot_work_are_rejected_without_showing_a_password(
        dcgm: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        quick_config(dcgm={"mode": "exporter", **dcgm})
    assert expected in str(info.value)
    assert_no_secret(str(info.value))


def test_settings_that_work_together_are_taken() -> None:
    https = "https://127.0.0.1:9400/metrics"
    for dcgm in ({"basic_auth_username": USER, "basic_auth_password_file": "/p"}, {"bearer_token_file": "/t"},
                 {"exporter_url": https, "ca_file": "/ca.pem", "cert_file": "/c.pem", "key_file": "/c.key"},
                 {"exporter_url": https, "insecure_skip_verify": True},
                 {"exporter_url": f"http://{USER}:{PASSWORD}@[::1]:9400/metrics"}):
        quick_config(dcgm={"mode": "exporter", **dcgm})
    assert quick_config().dcgm.insecure_skip_verify is False


def test_display_url_drops_the_user_info_only() -> None:
    assert fetch.display_url(f"https://{USER}:{PASSWORD}@gpu-node:9400/metrics?x=1") == \
        "https://gpu-node:9400/metrics?x=1"
    assert fetch.display_url("http://[::1]:9400/metrics") == "http://[::1]:9400/metrics"
    assert fetch.url_credentials(f"http://{USER}:{PASSWORD}@h/") == (USER, PASSWORD)
    assert fetch.url_credentials("http://h/") is None
