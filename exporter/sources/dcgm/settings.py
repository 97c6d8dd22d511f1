"""Settings of the `dcgm` source: DCGM's profiling fields, from its bindings or a dcgm-exporter."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ...core.settings import Duration, SourceConfig

DCGM_BINDINGS_PATHS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")


class DcgmConfig(SourceConfig):
    enabled: bool = Field(
        False, description="Run this source (off by default: it needs DCGM, or a dcgm-exporter on the node).")
    interval: Duration = Field(
        1.0, description="How often the source collects; with mode=bindings also DCGM's sampling period.")
    mode: Literal["bindings", "exporter"] = Field(
        "bindings", description="bindings: DCGM's Python bindings and its host engine; exporter: read the "
        "DCGM_FI_PROF_* series of a dcgm-exporter running on the node.")
    bindings_path: str = Field(
        "", description="Directory holding DCGM's Python bindings (pydcgm.py); empty: the first of "
        + " and ".join(DCGM_BINDINGS_PATHS) + " that exists.")
    hostengine: str = Field(
        "localhost", description="For mode=bindings, the nv-hostengine to connect to: HOST or HOST:PORT "
        "(TCP, port 5555 by default), unix:PATH (its Unix socket), or embedded (start DCGM's engine "
        "inside this process; needs root for profiling fields).")
    exporter_url: str = Field(
        "http://127.0.0.1:9400/metrics", description="For mode=exporter, the /metrics URL of the dcgm-exporter "
        "on this node; series are matched to this node's GPUs by UUID. User info in it (http://user:password@...) is "
        "sent as basic auth, with a warning: keep the password in dcgm.basic_auth_password_file instead.")
    basic_auth_username: str = Field(
        "", description="For mode=exporter, the user name sent with HTTP basic auth (a user of dcgm-exporter's "
        "--web-config-file basic_auth_users); needs basic_auth_password_file. Empty: no basic auth.")
    basic_auth_password_file: str = Field(
        "", description="File holding the basic-auth password (a mounted Secret; surrounding whitespace is "
        "ignored), read at every collection so that a rotated one is used.")
    bearer_token_file: str = Field(
        "", description="For mode=exporter, file holding a token sent as Authorization: Bearer (e.g. to a "
        "kube-rbac-proxy in front of dcgm-exporter), read at every collection; not with basic auth. Empty: none.")
    ca_file: str = Field(
        "", description="For an https:// exporter_url, the CA certificates (PEM) that dcgm-exporter's certificate "
        "is checked against; empty: the system's CAs. Reloaded when the file changes.")
    cert_file: str = Field(
        "", description="For an https:// exporter_url, the client certificate (PEM) shown to a dcgm-exporter that "
        "asks for one (its web config's client_ca_file); needs key_file. Reloaded when the file changes.")
    key_file: str = Field(
        "", description="The unencrypted private key (PEM) of cert_file.")
    insecure_skip_verify: bool = Field(
        False, description="For an https:// exporter_url, check neither dcgm-exporter's certificate nor its host "
        "name: the traffic is encrypted, but to whoever answers. For tests, not production.")

    @field_validator("hostengine")
    @classmethod
    def _check_hostengine(cls, value: str) -> str:
        if not value or (value.startswith("unix:") and len(value) == len("unix:")):
            raise ValueError(f"{value!r}: want HOST, HOST:PORT, unix:PATH or embedded")
        return value

    @field_validator("exporter_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        from .fetch import at_outside_host, display_url

        if at_outside_host(value):
            # never shown: what stands before the '@' may be a password
            raise ValueError("the URL has an '@' outside its host part: a password in it with '/', '?', '#' or "
                             "'@' must be percent-encoded (better: use dcgm.basic_auth_password_file)")
        shown = display_url(value)
        if shown == value:
            shown = repr(value)
        elif "://" in shown:
            shown = f"{shown!r} (its user info not shown)"
        if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
            raise ValueError(f"{shown} is not an http:// or https:// URL")
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 (raises on a port that is no number 0-65535)
        except ValueError as exc:
            raise ValueError(f"{shown}: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"{shown} names no host")
        return value

    @field_validator("basic_auth_username")
    @classmethod
    def _check_username(cls, value: str) -> str:
        if ":" in value or not value.isprintable():
            raise ValueError("a basic-auth user name holds no colon and no control characters")
        return value

    @model_validator(mode="after")
    def _check_exporter_access(self) -> DcgmConfig:
        from .fetch import url_credentials

        if bool(self.basic_auth_username) != bool(self.basic_auth_password_file):
            raise ValueError("dcgm.basic_auth_username and dcgm.basic_auth_password_file go together: set both or "
                             "neither")
        if self.basic_auth_username and self.bearer_token_file:
            raise ValueError("dcgm.basic_auth_* and dcgm.bearer_token_file both set: a request carries one "
                             "Authorization header, keep one")
        if url_credentials(self.exporter_url) is not None and (self.basic_auth_username or self.bearer_token_file):
            raise ValueError("dcgm.exporter_url holds a user name and password and dcgm.basic_auth_* or "
                             "dcgm.bearer_token_file is set too: take them out of the URL")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("dcgm.cert_file and dcgm.key_file go together: set both or neither")
        tls = [f"dcgm.{key}" for key in ("ca_file", "cert_file", "key_file", "insecure_skip_verify")
               if getattr(self, key)]
        if tls and not self.exporter_url.startswith("https://"):
            raise ValueError(f"{', '.join(tls)}: TLS settings, and dcgm.exporter_url is http://: nothing would be "
                             "encrypted or checked; use an https:// URL or remove them")
        return self
