"""`goodput-exporter diagnose`: the funnel's walk for a workload, asked of the Prometheus that runs the rules."""

from __future__ import annotations


def diagnose_command(argv: list[str]) -> int:
    """walk the funnel for workloads in a Prometheus and name the layer that holds each back; `diagnose --help`"""
    from .cli import main

    return main(argv)
