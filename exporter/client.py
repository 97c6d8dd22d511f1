"""Deprecated: the training client is its own distribution now, `goodput-client` (client/ in this
repository), with no dependency beyond the standard library. Install it and import goodput_client:

    from goodput_client import Telemetry

This module re-exports the same objects and will be removed in the next release.
"""

from __future__ import annotations

import warnings

from goodput_client import DEFAULT_SOCKET, PHASES, Telemetry

__all__ = ["DEFAULT_SOCKET", "PHASES", "Telemetry"]

warnings.warn("exporter.client is deprecated and will be removed in the next release; install goodput-client "
              "and import goodput_client", DeprecationWarning, stacklevel=2)
