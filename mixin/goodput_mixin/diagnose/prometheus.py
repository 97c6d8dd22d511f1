"""Asking a Prometheus, or anything that serves its HTTP API (Thanos, Mimir, VictoriaMetrics), instant queries.

Every failure is an AskError with one line that says what went wrong and what to try: the command prints it and
exits 2, never a traceback.
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass
from typing import Any

import httpx


class AskError(Exception):
    """Prometheus could not be asked, or did not answer as its API does; the message says why, in one line."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


def _reason(exc: httpx.HTTPError) -> str:
    """The cause of a transport error in a few words (httpx's message is the OS's, or the TLS library's)."""
    text = str(exc) or exc.__class__.__name__
    if "CERTIFICATE_VERIFY_FAILED" in text or isinstance(exc.__cause__, ssl.SSLCertVerificationError):
        detail = text.split("certificate verify failed:", 1)[-1].split("(_ssl", 1)[0].strip()
        return f"its TLS certificate cannot be verified ({detail}): pass --ca-file, or --insecure"
    if "Connection refused" in text:
        return "connection refused"
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "unknown host"
    return text.splitlines()[0]


class Prometheus:
    """One Prometheus, asked over one connection. `auth` and `headers` carry the credentials; `verify` is an SSL
    context (a CA file), True (the system's CAs) or False (--insecure)."""

    def __init__(self, url: str, *, auth: httpx.Auth | None = None, headers: dict[str, str] | None = None,
                 verify: ssl.SSLContext | bool = True, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._client = httpx.Client(base_url=self.url, auth=auth, headers=headers, verify=verify, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise AskError(f"Prometheus at {self.url} did not answer within {self.timeout:g}s (--timeout)") from None
        except httpx.HTTPError as exc:
            raise AskError(f"cannot reach Prometheus at {self.url}: {_reason(exc)}") from None

    def _refused(self, response: httpx.Response) -> AskError:
        return AskError(f"Prometheus at {self.url} refused the request: HTTP {response.status_code} "
                        f"{response.reason_phrase} (credentials: --token-file or --basic-auth-file)")

    def query(self, expr: str, at: float) -> list[Sample]:
        """The instant vector `expr` evaluates to at `at` (Unix seconds); samples that are not numbers (NaN, a
        ratio of zero to zero) are left out. POST: a query naming many workloads outgrows a URL."""
        response = self._ask("POST", "/api/v1/query", data={"query": expr, "time": f"{at:.3f}"})
        if response.status_code in (401, 403):
            raise self._refused(response)
        body = self._json(response)
        if response.status_code != 200 or body.get("status") != "success":
            error = body.get("error") or response.reason_phrase
            raise AskError(f"Prometheus at {self.url} answered HTTP {response.status_code} to "
                           f"{' '.join(expr.split())!r}: {error}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise AskError(f"Prometheus at {self.url} answered {expr!r} with a {data.get('resultType')}, "
                           "not an instant vector")
        samples = []
        for item in data.get("result", []):
            value = float(item["value"][1])
            if math.isfinite(value):
                samples.append(Sample(item["metric"], value))
        return samples

    def recording_rules(self) -> set[str] | None:
        """The names the recording rules loaded in it record, or None where it does not say (a query frontend or
        a remote store without a ruler's API)."""
        try:
            response = self._ask("GET", "/api/v1/rules", params={"type": "record"})
        except AskError:
            return None
        if response.status_code != 200:
            return None
        try:
            groups = response.json()["data"]["groups"]
            return {rule["name"] for group in groups for rule in group["rules"] if rule.get("type") == "recording"}
        except (ValueError, KeyError, TypeError):
            return None

    def _json(self, response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise AskError(f"{self.url} answered HTTP {response.status_code} with something other than Prometheus' "
                           "API (is it a Prometheus? the URL is its root, without /api/v1)")
        return body
