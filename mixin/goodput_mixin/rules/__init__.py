"""Prometheus rules, generated from one settings model: `goodput-exporter rules` writes rules/."""
