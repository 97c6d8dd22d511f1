"""The command line of `goodput-exporter diagnose`: where Prometheus is and how to authenticate, which workloads,
which settings the rules were generated with; exit 0 all healthy, 1 at least one verdict, 2 could not ask."""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from exporter.core.settings import ConfigError

from ..rules.settings import load_settings
from .prometheus import AskError, Prometheus
from .report import document, text
from .walk import Walk

URL_ENV = "GOODPUT_PROMETHEUS_URL"
DEFAULT_URL = "http://localhost:9090"
HEALTHY, VERDICT, CANNOT_ASK = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goodput-exporter diagnose",
        description="Walk the funnel (cluster, network, host, memory, kernel) for training workloads, as the goodput "
                    "rules in a Prometheus judged them: each check with the figure it compared, the verdict, the "
                    "queries to paste and the runbook to open. Exit 0: every workload healthy; 1: at least one has a "
                    "verdict; 2: Prometheus could not be asked. See docs/diagnose.md.")
    parser.add_argument("--prometheus", metavar="URL", default=os.environ.get(URL_ENV) or DEFAULT_URL,
                        help=f"Prometheus' root URL, or its API's (Thanos, Mimir: the prefix before /api/v1) "
                             f"(default: ${URL_ENV}, else {DEFAULT_URL})")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--workload", metavar="W", nargs="+", action="extend",
                       help="these workloads (default: every workload with a verdict)")
    which.add_argument("--worst", metavar="N", type=int,
                       help="the N workloads with the lowest goodput (those with no time accounted first)")
    auth = parser.add_mutually_exclusive_group()
    auth.add_argument("--token-file", metavar="FILE", help="a bearer token, sent as Authorization: Bearer")
    auth.add_argument("--basic-auth-file", metavar="FILE", help="basic auth credentials, one line: user:password")
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument("--ca-file", metavar="FILE", help="CA certificates (PEM) that verify Prometheus' certificate")
    tls.add_argument("--insecure", action="store_true", help="do not verify Prometheus' TLS certificate")
    parser.add_argument("--timeout", metavar="S", type=float, default=10.0,
                        help="seconds each request may take (default 10)")
    parser.add_argument("--rules-config", metavar="FILE",
                        help="the rules settings (YAML) the rules were generated with (`goodput-exporter rules "
                             "--settings FILE`): windows and thresholds (default: the defaults, as rules/ ships)")
    parser.add_argument("--json", action="store_true", help="print JSON (docs/diagnose.schema.json)")
    return parser


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path}: {exc.strerror}") from None


def _client(args: argparse.Namespace) -> Prometheus:
    """The Prometheus client the options describe; ConfigError for an unreadable or malformed credential file."""
    auth: httpx.Auth | None = None
    headers: dict[str, str] = {}
    if args.token_file:
        token = _read(args.token_file, "token file")
        if not token:
            raise ConfigError(f"the token file {args.token_file} is empty")
        headers["Authorization"] = f"Bearer {token}"
    if args.basic_auth_file:
        user, colon, password = _read(args.basic_auth_file, "basic auth file").partition(":")
        if not colon or not user:
            raise ConfigError(f"the basic auth file {args.basic_auth_file} must hold one line user:password")
        auth = httpx.BasicAuth(user, password)
    verify: ssl.SSLContext | bool = not args.insecure
    if args.ca_file:
        try:
            verify = ssl.create_default_context(cafile=args.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load CA certificates from {args.ca_file}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
    url = args.prometheus
    if "://" not in url:
        raise ConfigError(f"--prometheus {url!r} is not a URL (http://host:9090)")
    return Prometheus(url, auth=auth, headers=headers, verify=verify, timeout=args.timeout)


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    if args.worst is not None and args.worst < 1:
        parser.error("--worst wants at least 1")
    if args.timeout <= 0:
        parser.error("--timeout wants a positive number of seconds")
    try:
        settings = load_settings(args.rules_config)
        prometheus = _client(args)
    except ConfigError as exc:
        print(f"goodput-exporter diagnose: {exc}", file=sys.stderr)
        return CANNOT_ASK
    at = time.time()
    try:
        with prometheus:
            walk = Walk(prometheus, settings, at)
            targets = walk.targets(args.workload, args.worst)
            diagnoses = walk.diagnose(targets)
            warnings = walk.warnings()
    except AskError as exc:
        print(f"goodput-exporter diagnose: {exc}", file=sys.stderr)
        return CANNOT_ASK
    if args.json:
        json.dump(document(diagnoses, prometheus=prometheus.url, at=at, settings=args.rules_config or "defaults",
                           warnings=warnings), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for warning in warnings:
            print(f"goodput-exporter diagnose: warning: {warning}", file=sys.stderr)
        sys.stdout.write(text(diagnoses))
    return HEALTHY if all(d.healthy for d in diagnoses) else VERDICT
