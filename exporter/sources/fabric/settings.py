"""Settings of the `fabric` source."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from ...core.settings import Duration, SourceConfig


class FabricConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")
    sysfs_path: str = Field(
        "/sys", description="Mount point of the host's sysfs (e.g. /host/sys in a pod, mounted read-only), as "
        "node_exporter's --path.sysfs.")
    interfaces: str = Field(
        "", description="Regular expression of the network interfaces to read, matched against the whole name. "
        "Empty (the default): every interface backed by a device (physical NICs and RDMA-backed ones), which "
        "leaves out loopback, veth, bridges, bonds, VLANs, tunnels and other virtual interfaces.")

    @field_validator("interfaces")
    @classmethod
    def _a_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value
