"""Command line: `goodput-exporter [serve] [flags]`, `metrics-doc`, `config-doc`, `version`."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .config import Config, ConfigError, flag_name, load, settable_keys
from .sockets import bind

log = logging.getLogger("exporter")

COMMANDS = ("serve", "demo", "rules", "metrics-doc", "config-doc", "version")


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goodput-exporter serve",
        description="Run the node daemon. Every flag mirrors a config key (see docs/configuration.md).",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", metavar="FILE", help="YAML config file (also GOODPUT_CONFIG)")
    parser.add_argument("--simulate", metavar="N", dest="simulate.gpus",
                        help="use N simulated GPUs instead of NVML (same as --simulate.gpus)")
    for section, key, field in settable_keys():
        parser.add_argument(flag_name(section, key), dest=f"{section}.{key}", metavar="VALUE",
                            help=field.description)
    return parser


def parse_serve_args(argv: Sequence[str], environ: dict[str, str] | None = None) -> Config:
    """Flags -> effective Config. Raises ConfigError; argparse exits 2 on an unknown flag."""
    args = vars(_serve_parser().parse_args(argv))
    path = args.pop("config", None)
    flags: dict[str, dict[str, Any]] = {}
    for dest, value in args.items():
        section, key = dest.split(".", 1)
        flags.setdefault(section, {})[key] = value
    config = load(path, flags, environ)
    return config


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": self.formatTime(record), "level": record.levelname.lower(),
                 "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def serve(config: Config) -> int:
    import uvicorn

    from .daemon import Daemon
    from .http_server import QuietServer
    from .web import create_app

    setup_logging(config.log.level, config.log.format)
    daemon = Daemon(config)  # may raise ConfigError (e.g. an unreadable token file): before any bind
    try:
        sock = bind(config.web.listen_address)
    except OSError as exc:
        log.error("%s", exc)
        return 1
    daemon.start()
    host, port = sock.getsockname()[:2]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    log.info("goodput-exporter %s serving on http://%s:%d/ (metrics: http://%s:%d/metrics)",
             __version__, shown, port, shown, port)
    server = QuietServer(uvicorn.Config(
        create_app(daemon), log_config=None, access_log=False, lifespan="off",
        http="httptools", loop="auto", timeout_keep_alive=75))
    started = time.monotonic()
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal against the handlers
    # that were in place before it started; these turn that into a clean exit through `finally`.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_cleanly)
    try:
        server.run(sockets=[sock])
    finally:
        daemon.stop()
        log.info("stopped after %.0fs", time.monotonic() - started)
    return 0


def rules_command(argv: list[str]) -> int:
    """`goodput-exporter rules [--settings FILE] [--out DIR] [--check]`."""
    from .rules.render import rule_files
    from .rules.settings import load_settings

    parser = argparse.ArgumentParser(
        prog="goodput-exporter rules",
        description="Write the Prometheus recording rules generated from the rules settings.")
    parser.add_argument("--settings", help="YAML file overriding the default thresholds, windows and labels")
    parser.add_argument("--out", default="rules", help="directory to write into (default: rules)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a file in --out differs from what would be written")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.settings)
    except ConfigError as exc:
        print(f"goodput-exporter: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    stale = []
    for name, text in rule_files(settings, source=args.settings or "defaults").items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)} (run `make rules`)", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "serve"
    if argv and argv[0] in COMMANDS:
        command = argv.pop(0)
    elif argv and argv[0] in ("-h", "--help"):
        print(f"usage: goodput-exporter [{'|'.join(COMMANDS)}] [flags]\n"
              "  serve (default)  run the node daemon; `goodput-exporter serve --help` lists its flags\n"
              "  demo             the live stack on 127.0.0.1: daemon, simulated job, Prometheus, Alertmanager\n"
              "  rules            write the Prometheus rule files (rules/); `rules --help` for options\n"
              "  metrics-doc      print the metrics reference (docs/metrics.md)\n"
              "  config-doc       print the configuration reference (docs/configuration.md)\n"
              "  version          print the version")
        return 0
    if command == "version":
        print(__version__)
        return 0
    if command == "rules":
        return rules_command(argv)
    if command == "demo":
        from .demo.console import main as demo_main

        return demo_main(argv)
    if command == "metrics-doc":
        from .docs import metrics_markdown

        sys.stdout.write(metrics_markdown())
        return 0
    if command == "config-doc":
        from .docs import config_markdown

        sys.stdout.write(config_markdown())
        return 0
    try:
        return serve(parse_serve_args(argv))
    except ConfigError as exc:
        print(f"goodput-exporter: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
