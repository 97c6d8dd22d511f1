"""goodput-exporter: GPU goodput telemetry for Prometheus."""

__version__ = "0.1.0"
