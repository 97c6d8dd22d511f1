"""Command line: `goodput-exporter [serve] [flags]`, `captures`, `version`, and the build tools' commands.

The runtime has four commands of its own (`health` is the node health check schedulers run, `captures` lists the
daemon's captures from its index). The build tools (the goodput-mixin distribution: `demo`, `rules`, `metrics-doc`,
`config-doc`, `diagnose`) add theirs through the `goodput_exporter.commands` entry points, so they work wherever the
mixin is installed and the runtime never imports it.

`serve` exits with 0 when stopped (SIGTERM, SIGINT), EXIT_LISTEN_FAILED (1) when web.listen_address cannot be bound,
EXIT_CONFIG (2) on a configuration error, and EXIT_SOCKET_IN_USE (3) when the events socket (ingest.socket_path) is
served by a running process, another daemon most likely: it is never replaced.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from . import __version__
from .config import Config, ConfigError, flag_name, load, settable_keys
from .core.daemon import StartRefused

log = logging.getLogger("exporter")

EXIT_LISTEN_FAILED = 1
EXIT_CONFIG = 2
EXIT_SOCKET_IN_USE = 3
EXIT_STATUS = (f"exit status: 0 stopped, {EXIT_LISTEN_FAILED} web.listen_address cannot be bound, {EXIT_CONFIG} "
               f"configuration error, {EXIT_SOCKET_IN_USE} the events socket is served by a running process")

BUILTIN = ("serve", "version", "captures", "health")
TOOLS_GROUP = "goodput_exporter.commands"
TOOLS_HINT = ("the build tools' commands (demo, rules, metrics-doc, config-doc, diagnose) come with goodput-mixin: "
              "pip install ./mixin from the source tree")


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="goodput-exporter serve",
        description="Run the node daemon. Every flag mirrors a config key (see docs/configuration.md).",
        argument_default=argparse.SUPPRESS,
        epilog=EXIT_STATUS,
    )
    parser.add_argument("--config", metavar="FILE", help="YAML config file (also GOODPUT_CONFIG)")
    parser.add_argument("--simulate", metavar="N", dest="simulate.gpus",
                        help="use N simulated GPUs instead of NVML (same as --simulate.gpus)")
    for section, key, field in settable_keys():
        parser.add_argument(flag_name(section, key), dest=f"{section}.{key}", metavar="VALUE",
                            help=(field.description or "").replace("%", "%%"))  # argparse %-formats help
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
    from .core.logs import RepeatFilter

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RepeatFilter())  # repeated lines (a flood of bad requests) rate-limited, with a count
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
    from .assemble import build_daemon
    from .core import allocator
    from .core.connections import ServerLimits, raise_open_files_limit
    from .core.http import bind, create_app, make_server  # FastAPI: only for serve (health starts per check)

    setup_logging(config.log.level, config.log.format)
    allocator.tune()  # before the daemon allocates much: see exporter/core/allocator.py
    raise_open_files_limit()  # before anything opens a file: the servers' connection budget is taken from it
    daemon = build_daemon(config)  # may raise ConfigError (e.g. an unreadable token file): before any bind
    try:
        sock = bind(config.web.listen_address)
    except OSError as exc:
        log.error("%s", exc)
        return EXIT_LISTEN_FAILED
    try:
        daemon.start()
    except StartRefused as exc:
        sock.close()
        log.error("%s", exc)
        return EXIT_SOCKET_IN_USE
    host, port = sock.getsockname()[:2]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    log.info("goodput-exporter %s serving on http://%s:%d/ (metrics: http://%s:%d/metrics)",
             __version__, shown, port, shown, port)
    # once the server starts shutting down, the sources (the events server among them) stop alongside its
    # graceful shutdown, not after it: SIGTERM takes the longer of the two shutdown timeouts, not their sum
    server = make_server(create_app(daemon), "metrics", ServerLimits.of(config.web),
                         on_exit=lambda: threading.Thread(target=daemon.stop, name="stop", daemon=True).start())
    started = time.monotonic()
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal against the handlers
    # that were in place before it started; these turn that into a clean exit through `finally`.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_cleanly)
    trimmed = threading.Event()
    allocator.trim_every(allocator.TRIM_SECONDS, trimmed)
    try:
        server.run(sockets=[sock])
    finally:
        trimmed.set()
        daemon.stop()  # or wait for the stop that on_exit began
        log.info("stopped after %.0fs", time.monotonic() - started)
    return 0


def tool_commands() -> dict[str, EntryPoint]:
    """The commands installed distributions add (goodput-mixin's), by name; loaded only when run or listed."""
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=TOOLS_GROUP):
        if entry.name not in BUILTIN:
            found.setdefault(entry.name, entry)
    return found


def _load(entry: EntryPoint) -> Callable[[list[str]], int]:
    """The command behind an entry point; a broken installation is a ConfigError naming it, not a traceback."""
    try:
        return entry.load()  # type: ignore[no-any-return]
    except Exception as exc:
        dist = entry.dist.name if entry.dist is not None else "its distribution"
        raise ConfigError(f"command {entry.name!r} ({entry.value}, from {dist}) cannot be loaded: "
                          f"{exc.__class__.__name__}: {exc}") from None


def _usage(tools: dict[str, EntryPoint]) -> str:
    names = ("serve", "captures", "health", *tools, "version")
    lines = [f"usage: goodput-exporter [{'|'.join(names)}] [flags]",
             "  serve (default)  run the node daemon; `goodput-exporter serve --help` lists its flags",
             "  captures         list the captures the daemon asked ranks for (--dir DIR, --workload W, --json)",
             "  health           node health check for Slurm and node-problem-detector: drain at GPU risk"]
    for name, entry in tools.items():
        try:
            doc = _load(entry).__doc__ or ""
        except ConfigError as exc:
            doc = str(exc)
        lines.append(f"  {name:<16} {doc.strip().splitlines()[0] if doc.strip() else ''}")
    lines.append("  version          print the version")
    if not tools:
        lines.append(f"  ({TOOLS_HINT})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "serve"
    if argv and argv[0] in BUILTIN:
        command = argv.pop(0)
    elif argv and argv[0] in ("-h", "--help"):
        print(_usage(tool_commands()))
        return 0
    elif argv and not argv[0].startswith("-"):
        tools = tool_commands()
        if argv[0] not in tools:
            print(f"goodput-exporter: unknown command {argv[0]!r} (commands: {', '.join((*BUILTIN, *tools))}; "
                  f"{TOOLS_HINT})", file=sys.stderr)
            return 2
        try:
            command_main = _load(tools[argv[0]])
        except ConfigError as exc:
            print(f"goodput-exporter: {exc}", file=sys.stderr)
            return 2
        return command_main(argv[1:])
    if command == "version":
        print(__version__)
        return 0
    if command == "health":
        from .health.command import main as health_main

        return health_main(argv)
    if command == "captures":
        from .captures_cli import main as captures_main

        return captures_main(argv)
    try:
        return serve(parse_serve_args(argv))
    except ConfigError as exc:
        print(f"goodput-exporter: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
