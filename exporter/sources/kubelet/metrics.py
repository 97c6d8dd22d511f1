"""Metrics of the `kubelet` source: which pod each GPU is assigned to."""

from __future__ import annotations

from ...core.catalog import GPU, Declarer, Kind

_m = Declarer("kubelet")

GPU_POD_INFO = _m(
    "goodput_gpu_pod_info", Kind.INFO, "",
    "The pod and container the kubelet assigned the GPU to (pod-resources API); one series per container and "
    "MIG instance. mig_uuid names the MIG instance (MIG-...) when the device is one, and is empty for a whole "
    "GPU (including a time-sliced or MPS share of one). Join on uuid, aggregating first where a GPU has "
    "several (max by (instance, uuid, namespace, pod)); value is always 1. With kubelet.pod_labels set, also one "
    "label_<name> label per listed pod label (from the Kubernetes API; empty when the pod has no such label or "
    "the API could not be asked), to join on instead of copying labels onto every GPU series.",
    (*GPU, "mig_uuid", "pod", "namespace", "container"))
KUBELET_SKIPPED = _m(
    "goodput_kubelet_skipped_devices", Kind.GAUGE, "",
    "GPU devices in the kubelet's last answer that were not attributed, by reason: unmatched (the device id, "
    "or the DRA device, names no GPU NVML sees on this node), invalid (its pod, namespace or container name, "
    "or its device id, cannot be valid). Counted per device, after kubelet.gpu_resources: devices of other "
    "resources are not counted.", ("reason",))
KUBELET_POD_LABELS_UP = _m(
    "goodput_kubelet_pod_labels_up", Kind.GAUGE, "",
    "1 while the label_* labels on goodput_gpu_pod_info come from a Kubernetes API answer at most 3 kubelet "
    "intervals old, 0 while they are left out because the API server could not be asked (why: "
    "goodput_exporter_source_errors_total{source=\"kubelet\",reason=~\"pod_labels_.*\"}); absent when "
    "kubelet.pod_labels is empty.", ())

METRICS = _m.metrics
