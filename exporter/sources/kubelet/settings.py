"""Settings of the `kubelet` source: pod-resources attribution, and pod labels from the API server."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from ...core.settings import Duration, SourceConfig

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_POD_LABELS = 32
DEFAULT_GPU_RESOURCES = "nvidia.com/gpu,nvidia.com/gpu.*,nvidia.com/mig-*"
_RESOURCE_PATTERN = re.compile(r"[A-Za-z0-9*?][-A-Za-z0-9_.*?]*/[-A-Za-z0-9_.*?]+")


def gpu_resource_patterns(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class KubeletConfig(SourceConfig):
    enabled: bool = Field(
        False, description="Run this source (off by default, so that nodes outside Kubernetes show no failing "
        "source; on Kubernetes turn it on and mount the pod-resources socket).")
    interval: Duration = Field(10.0, description="How often the source asks the kubelet.")
    timeout: Duration = Field(
        5.0, description="A List call is given four fifths of this; a collection running longer marks the source down.")
    socket_path: str = Field(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        description="The kubelet's pod-resources socket (mount /var/lib/kubelet/pod-resources into the pod).")
    gpu_resources: str = Field(
        DEFAULT_GPU_RESOURCES,
        description="Comma-separated shell-style patterns (*, ?) of the extended resources whose devices are GPUs: "
        "by default nvidia.com/gpu, its sharing variants (nvidia.com/gpu.shared) and MIG resources "
        "(nvidia.com/mig-1g.10gb), and not other resources under nvidia.com/ such as the Network Operator's "
        "SR-IOV and RDMA devices. DRA devices are GPUs when allocated by gpu.nvidia.com or when their CDI "
        "name is of kind nvidia.com/gpu or names a GPU-/MIG- UUID.")
    pod_labels: str = Field(
        "", description="Comma-separated pod label names (e.g. team,app.kubernetes.io/name) whose values are added "
        "to goodput_gpu_pod_info as label_<name> (characters outside [a-zA-Z0-9_] become _, as in "
        "kube-state-metrics' kube_pod_labels), read from the Kubernetes API server on this source's interval; "
        "empty: off, and the API server is never called. Needs kubelet.node_name and RBAC to list pods.")
    node_name: str = Field(
        "", description="This node's Kubernetes name, for listing its pods when pod_labels is set: set "
        "GOODPUT_KUBELET_NODE_NAME from the downward API (fieldRef spec.nodeName).")
    api_url: str = Field(
        "", description="The Kubernetes API server, e.g. https://10.0.0.1:443; empty: the in-cluster address "
        "(https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).")
    api_token_file: str = Field(
        f"{SERVICE_ACCOUNT_DIR}/token", description="Bearer token for the API server, read on every call (the "
        "kubelet rotates it); empty: send none.")
    api_ca_file: str = Field(
        f"{SERVICE_ACCOUNT_DIR}/ca.crt", description="CA bundle the API server's certificate is checked against; "
        "empty: the system's CAs.")
    api_max_bytes: int = Field(
        32 * 2**20, ge=1024, description="Larger answers from the API server are rejected (reason "
        "pod_labels_oversize) and the labels are left out.")

    @field_validator("gpu_resources")
    @classmethod
    def _check_gpu_resources(cls, value: str) -> str:
        patterns = gpu_resource_patterns(value)
        if not patterns:
            raise ValueError("name at least one resource pattern, e.g. nvidia.com/gpu")
        for pattern in patterns:
            if not _RESOURCE_PATTERN.fullmatch(pattern):
                raise ValueError(f"{pattern!r} is not a resource name pattern such as nvidia.com/gpu or "
                                 "nvidia.com/mig-*")
        return value

    @field_validator("pod_labels")
    @classmethod
    def _check_pod_labels(cls, value: str) -> str:
        from .podlabels import prometheus_label, valid_label_key

        names = pod_label_names(value)
        if len(names) > MAX_POD_LABELS:
            raise ValueError(f"{len(names)} label names; at most {MAX_POD_LABELS} (each is a label on every "
                             "goodput_gpu_pod_info series)")
        seen: dict[str, str] = {}
        for name in names:
            if not valid_label_key(name):
                raise ValueError(f"{name!r} is not a Kubernetes label name such as team or app.kubernetes.io/name")
            label = prometheus_label(name)
            if label in seen:
                raise ValueError(f"{seen[label]!r} and {name!r} are both {label} on our series: keep one")
            seen[label] = name
        return value

    @field_validator("node_name")
    @classmethod
    def _check_node_name(cls, value: str) -> str:
        from .k8s_names import SUBDOMAIN

        if value and not SUBDOMAIN.fullmatch(value):
            raise ValueError(f"{value!r} is not a Kubernetes node name")
        return value

    @field_validator("api_url")
    @classmethod
    def _check_api_url(cls, value: str) -> str:
        if value and not re.match(r"^https?://[^/\s?#]+/?$", value):
            raise ValueError(f"{value!r}: want an http:// or https:// URL of the API server, no path")
        return value

    @model_validator(mode="after")
    def _pod_labels_need_node(self) -> KubeletConfig:
        if self.enabled and self.pod_labels.strip() and not self.node_name:
            raise ValueError("kubelet.pod_labels needs kubelet.node_name: set GOODPUT_KUBELET_NODE_NAME from the "
                             "downward API (valueFrom.fieldRef.fieldPath: spec.nodeName)")
        return self


def pod_label_names(value: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
