"""What Kubernetes allows as object names, shared by the kubelet and API-server readers and the config.

No gRPC or HTTP here: the config checks a node name with these without loading either client."""

from __future__ import annotations

import re

MAX_PODS = 10_000  # pods in one answer, from the kubelet or the API server; more is refused as oversize
# pod and node names are DNS subdomains (253), namespaces and container names DNS labels (63)
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
