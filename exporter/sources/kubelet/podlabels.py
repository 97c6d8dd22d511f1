"""Pod labels from the Kubernetes API server, for the pods of this node, refreshed in the background.

pod-resources names pods but carries no labels, so the labels come from one list call:
`GET /api/v1/pods?fieldSelector=spec.nodeName=<node>&resourceVersion=0`, asking for metadata only
(PartialObjectMetadataList, with a plain PodList accepted as the fallback) and served from the API
server's watch cache (`resourceVersion=0`), so a DaemonSet on every node asking every interval costs
the API server little and never reaches etcd. Plain httpx, not the `kubernetes` client: one GET, a
bearer token and a CA file do not need a multi-megabyte dependency and its own threads.

The answer is hostile input: at most `max_bytes` of it are read and at most MAX_PODS pods taken
(`oversize`); an answer that is not JSON or not shaped like a pod list is rejected whole
(`malformed`); a pod whose name cannot be valid, or a label value that cannot be, is skipped and
counted (`invalid`). The call never holds up a scrape or the pod-resources mapping: it runs on its
own thread, and the kubelet source only reads the last answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from .k8s_names import LABEL, MAX_PODS, SUBDOMAIN

log = logging.getLogger(__name__)

METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
ACCEPT = f"{METADATA_ONLY},application/json;q=0.9"
STALE_AFTER_INTERVALS = 3  # the last answer's labels are kept through this many intervals of failures
MAX_LABEL_VALUE = 63
MAX_TOKEN_BYTES = 64 * 1024
RBAC_HINT = ('bind the exporter\'s service account to a ClusterRole with the rule {apiGroups: [""], '
             'resources: ["pods"], verbs: ["get", "list"]}')
_INVALID_CHAR = re.compile(r"[^a-zA-Z0-9_]")
# a label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters
_KEY_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")

PodKey = tuple[str, str]  # (namespace, pod)


def prometheus_label(name: str) -> str:
    """A pod label's name on our series, as kube-state-metrics spells it in kube_pod_labels:
    `label_` and the name with every character outside [a-zA-Z0-9_] replaced by `_`."""
    return "label_" + _INVALID_CHAR.sub("_", name)


def valid_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_KEY_NAME.fullmatch(name))


def in_cluster_url(environ: Mapping[str, str]) -> str | None:
    """The API server as a pod sees it (the variables Kubernetes sets in every container)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port.isdigit():
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class PodLabelsError(Exception):
    """A list call failed; `reason` (prefixed pod_labels_) labels goodput_exporter_source_errors_total."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class Answer:
    labels: dict[PodKey, tuple[str, ...]]  # the wanted labels' values, in `wanted` order ("" when unset)
    invalid: int  # pods and label values skipped as invalid


class PodLabelsClient:
    def __init__(self, url: str, node: str, wanted: tuple[str, ...], token_file: str, ca_file: str,
                 timeout: float, max_bytes: int) -> None:
        self.url = url.rstrip("/")
        self.node = node
        self.wanted = wanted
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._client: httpx.Client | None = None

    def _connect(self) -> httpx.Client:
        if self._client is None:
            verify: ssl.SSLContext | bool = True
            if self.url.startswith("https://") and self.ca_file:
                try:
                    verify = ssl.create_default_context(cafile=self.ca_file)
                except (OSError, ssl.SSLError) as exc:
                    raise PodLabelsError("no_credentials", f"cannot load the CA file {self.ca_file}: {exc}") from None
            self._client = httpx.Client(verify=verify, timeout=self.timeout, follow_redirects=False,
                                        trust_env=False)
        return self._client

    def _token(self) -> str:
        """Read on every call: the kubelet rotates projected service-account tokens in place."""
        if not self.token_file:
            return ""
        try:
            with open(self.token_file, "rb") as f:
                token = f.read(MAX_TOKEN_BYTES).decode("ascii", errors="replace").strip()
        except OSError as exc:
            raise PodLabelsError("no_credentials", f"cannot read the service-account token {self.token_file}: "
                                 f"{exc.strerror} (is automountServiceAccountToken off?)") from None
        if not token or not token.isprintable() or " " in token:
            raise PodLabelsError("no_credentials", f"{self.token_file} holds no usable token")
        return token

    def list(self) -> Answer:
        if not self.url:
            raise PodLabelsError("not_in_cluster", "KUBERNETES_SERVICE_HOST/_PORT are not set (not in a pod?) and "
                                 "kubelet.api_url is empty")
        headers = {"Accept": ACCEPT}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        params = {"fieldSelector": f"spec.nodeName={self.node}", "resourceVersion": "0"}
        client = self._connect()
        deadline = time.monotonic() + self.timeout
        try:
            with client.stream("GET", f"{self.url}/api/v1/pods", params=params, headers=headers) as response:
                body = bytearray()
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise PodLabelsError("oversize", f"the answer is {int(declared)} bytes (kubelet.api_max_bytes "
                                         f"is {self.max_bytes})")
                for chunk in response.iter_raw():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise PodLabelsError("oversize", f"the answer is over {self.max_bytes} bytes "
                                             "(kubelet.api_max_bytes)")
                    if time.monotonic() > deadline:
                        raise PodLabelsError("timeout", f"the answer took over {self.timeout:g}s (kubelet.timeout)")
                status = response.status_code
        except httpx.TimeoutException:
            raise PodLabelsError("timeout", f"no answer within {self.timeout:g}s (kubelet.timeout)") from None
        except httpx.TransportError as exc:
            self.close()  # the next call connects afresh (a new API server address, a reloaded CA)
            cause = exc.__context__ or exc.__cause__
            if isinstance(cause, ssl.SSLError) or "CERTIFICATE" in str(exc).upper():
                raise PodLabelsError("tls", f"TLS with {self.url} failed: {exc} (kubelet.api_ca_file)") from None
            raise PodLabelsError("unreachable", f"{self.url}: {exc.__class__.__name__}: {exc}") from None
        if status != 200:
            raise _status_error(status, bytes(body))
        return parse(bytes(body), self.wanted)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _status_error(status: int, body: bytes) -> PodLabelsError:
    message = ""
    with contextlib.suppress(ValueError, AttributeError, RecursionError):  # a Status object, if it is one
        message = "".join(ch for ch in str(json.loads(body).get("message", ""))[:300] if ch.isprintable())
    detail = f" ({message})" if message else ""
    if status == 401:
        return PodLabelsError("unauthorized", f"the API server rejected the service-account token (401){detail}: "
                              "check kubelet.api_token_file and that the token is mounted and current")
    if status == 403:
        return PodLabelsError("forbidden", f"the service account may not list pods (403){detail}: {RBAC_HINT}")
    return PodLabelsError("http_error", f"the API server answered {status}{detail}")


def parse(body: bytes, wanted: tuple[str, ...]) -> Answer:
    """The wanted labels of every pod in a PodList or PartialObjectMetadataList."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise PodLabelsError("malformed", f"the answer is not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("items", []), list | None):
        raise PodLabelsError("malformed", "the answer is not a pod list (no items list)")
    if document.get("kind") not in ("PodList", "PartialObjectMetadataList", None):
        raise PodLabelsError("malformed", f"the answer is a {str(document.get('kind'))[:60]}, not a pod list")
    items = document.get("items") or []
    if len(items) > MAX_PODS:
        raise PodLabelsError("oversize", f"{len(items)} pods in one answer (at most {MAX_PODS})")
    out: dict[PodKey, tuple[str, ...]] = {}
    invalid = 0
    for item in items:
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict):
            raise PodLabelsError("malformed", "a pod list item without metadata")
        name, namespace = metadata.get("name"), metadata.get("namespace")
        labels = metadata.get("labels") or {}
        if not (isinstance(name, str) and isinstance(namespace, str) and SUBDOMAIN.fullmatch(name)
                and LABEL.fullmatch(namespace)) or not isinstance(labels, dict):
            invalid += 1
            continue
        values = []
        for key in wanted:
            value = labels.get(key, "")
            if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE or not value.isprintable():
                invalid += 1
                value = ""
            values.append(value)
        out[(namespace, name)] = tuple(values)
    return Answer(out, invalid)


class PodLabeler:
    """Asks the API server every `interval` on its own thread and keeps the last answer.

    `current()` is what the kubelet source reads on each collection: the labels of the last answer
    while it is at most STALE_AFTER_INTERVALS intervals old (one failed call does not strip every
    GPU's labels and churn its series), else None; and the failures since the last read, by reason,
    to be counted once each.
    """

    def __init__(self, client: PodLabelsClient, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._answer: Answer | None = None
        self._answered_at = 0.0
        self._failures: Counter[str] = Counter()
        self._last_reason: str | None = None
        self._thread = threading.Thread(target=self._loop, name="kubelet-pod-labels", daemon=True)

    def start(self) -> PodLabeler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.refresh()
                self._stop.wait(self.interval)
        finally:
            self.client.close()

    def refresh(self) -> None:
        try:
            answer = self.client.list()
        except PodLabelsError as exc:
            self._failed(exc.reason, str(exc))
        except Exception as exc:  # a bug here must cost the labels, never the thread
            log.exception("kubelet pod labels: unexpected error")
            self._failed("exception", f"{exc.__class__.__name__}: {exc}")
        else:
            with self._lock:
                self._answer, self._answered_at = answer, self._clock()
                if answer.invalid:
                    self._failures["invalid"] += answer.invalid
            if self._last_reason is not None:
                log.info("kubelet pod labels: the Kubernetes API answers again (%d pods)", len(answer.labels))
            self._last_reason = None

    def _failed(self, reason: str, message: str) -> None:
        with self._lock:
            self._failures[reason] += 1
        if reason != self._last_reason:  # transitions, not every failed call
            log.warning("kubelet pod labels (%s): %s; GPUs keep their pods, without labels after %d failed "
                        "refreshes", reason, message, STALE_AFTER_INTERVALS)
        self._last_reason = reason

    def current(self) -> tuple[dict[PodKey, tuple[str, ...]] | None, list[str]]:
        """(labels by (namespace, pod), or None when there is no fresh answer; error reasons to count)."""
        with self._lock:
            failures = [f"pod_labels_{reason}" for reason, n in self._failures.items() for _ in range(n)]
            self._failures.clear()
            answer = self._answer
            if answer is not None and self._clock() - self._answered_at > STALE_AFTER_INTERVALS * self.interval:
                answer = None
        return (answer.labels if answer is not None else None), failures

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(1.0)  # a call in flight ends by its own timeout; the thread is a daemon
