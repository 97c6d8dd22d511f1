"""The build tools' commands, which `goodput-exporter` offers through the `goodput_exporter.commands` entry points
(mixin/pyproject.toml): each takes the arguments after its name and returns the exit code. The first line of each
docstring is its line in `goodput-exporter --help`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.core.settings import ConfigError

from .rules.render import rule_files
from .rules.settings import load_settings


def demo_command(argv: list[str]) -> int:
    """the live stack on 127.0.0.1: daemon, simulated job, Prometheus, Alertmanager"""
    from .demo.console import main

    return main(argv)


def rules_command(argv: list[str]) -> int:
    """write the Prometheus rule files (rules/); `rules --help` for options"""
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


def metrics_doc_command(argv: list[str]) -> int:
    """print the metrics reference (docs/metrics.md)"""
    from .docs import metrics_markdown

    sys.stdout.write(metrics_markdown())
    return 0


def config_doc_command(argv: list[str]) -> int:
    """print the configuration reference (docs/configuration.md)"""
    from .docs import config_markdown

    sys.stdout.write(config_markdown())
    return 0
