"""`python -m goodput_mixin.dashboards [--out DIR] [--settings RULES_SETTINGS.yaml]`: write the dashboard JSON."""

from __future__ import annotations

import argparse
import sys

from exporter.core.settings import ConfigError

from ..rules.settings import load_settings
from . import write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m goodput_mixin.dashboards", description=__doc__)
    parser.add_argument("--out", default="dashboards", help="folder to write the JSON files into")
    parser.add_argument("--settings", help="rules settings YAML (windows, labels, thresholds), as for `rules`")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.settings)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in write(args.out, settings):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
