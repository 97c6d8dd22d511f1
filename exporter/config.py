"""Configuration: YAML file, then `GOODPUT_*` environment variables, then flags; validated strictly.

Every key has one spelling per layer, derived from the model below:

    file   nvml: {interval: 1s}
    env    GOODPUT_NVML_INTERVAL=1s
    flag   --nvml.interval 1s

Any error (unknown key, wrong type, bad duration) raises `ConfigError` naming the key; the CLI turns
that into exit code 2 before anything binds a port.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

ENV_PREFIX = "GOODPUT_"
DEFAULT_PORT = 9445
MAX_DURATION = 86_400.0
# Kubernetes injects service links for a Service named goodput-exporter into every pod of the
# namespace (GOODPUT_EXPORTER_SERVICE_HOST, GOODPUT_EXPORTER_PORT_9445_TCP, ...): not ours, ignored.
_SERVICE_LINK = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_[A-Z]+)?)?)$")


class ConfigError(Exception):
    """A configuration problem, phrased for the person who wrote the config."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """`500ms`, `1s`, `1.5s`, `2m`, `1h`, or a bare number of seconds -> seconds (float)."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 1s, 2m)")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 1s, 2m)") from None
        else:
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 1s, 2m)")
    if not seconds > 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    if not seconds <= MAX_DURATION:
        raise ValueError(f"duration {value!r} is longer than the maximum of 24h")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


Duration = Annotated[float, BeforeValidator(parse_duration)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def parse_listen_address(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces) or `[v6]:PORT` -> (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(
            f"invalid listen address {value!r} (want HOST:PORT, e.g. 0.0.0.0:{DEFAULT_PORT})")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)
    elif host == "":
        host = "0.0.0.0"
    return host, port


class WebConfig(_Section):
    listen_address: str = Field(
        f"0.0.0.0:{DEFAULT_PORT}",
        description="Address the HTTP server (/metrics, /healthz, /readyz) binds.")

    @field_validator("listen_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        parse_listen_address(value)
        return value


class LogConfig(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    format: Literal["text", "json"] = Field("text", description="Log line format.")


class SourceConfig(_Section):
    enabled: bool = Field(True, description="Run this source.")
    interval: Duration = Field(1.0, description="How often the source collects.")
    timeout: Duration = Field(
        5.0, description="A collection running longer than this marks the source down (it is left to finish).")


class NvmlConfig(SourceConfig):
    pass


class HostConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")
    proc_path: str = Field(
        "/proc", description="Mount point of the host's procfs (e.g. /host/proc in a pod); the process source "
        "reads it too.")


def _loopback_address(value: str) -> str:
    if value:
        host, _ = parse_listen_address(value)
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"{value!r} is not a loopback address: the ingest API must not leave the node")
    return value


class IngestConfig(SourceConfig):
    socket_path: str = Field(
        "/run/goodput-exporter/ingest.sock",
        description="Unix socket training jobs send events to (share it with pods through a hostPath).")
    listen_address: Annotated[str, BeforeValidator(str)] = Field(
        "", description="Also accept events on this loopback TCP address (HOST:PORT); empty: off.")
    token_file: str = Field(
        "", description="File holding a bearer token that event requests must present; empty: no token.")
    max_body_bytes: int = Field(4 * 2**20, ge=1024, description="Largest request body accepted.")
    max_batch_events: int = Field(10_000, ge=1, description="Most events in one request.")
    max_workloads: int = Field(32, ge=1, description="Live workloads kept on this node; more are rejected.")
    max_ranks: int = Field(
        512, ge=1, description="Live (workload, rank) pairs kept on this node; more are rejected.")
    idle_timeout: Duration = Field(
        600.0, description="A rank that reports nothing for this long has its series removed.")

    @field_validator("listen_address")
    @classmethod
    def _check_loopback(cls, value: str) -> str:
        return _loopback_address(value)


class FlightConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")
    dir: str = Field(
        "/run/goodput-exporter/flight",
        description="Directory of flight-recorder dumps: DIR/<workload>/<prefix><rank>[.pkl|.json], or "
        "DIR/<prefix><rank> for workload 'default'.")
    prefix: str = Field(
        "nccl_trace_rank_",
        description="File-name prefix before the rank (PyTorch's TORCH_FR_DUMP_TEMP_FILE default).")
    max_file_bytes: int = Field(64 * 2**20, ge=1024, description="Larger dump files are rejected unread.")
    max_files: int = Field(
        512, ge=1, description="Most dump files read; beyond it the most recently written are kept.")
    rank_missing_after: Duration = Field(
        10.0, description="A rank is reported missing from a collective only when its own dump was "
        "written this long after another rank enqueued it.")

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if "/" in value or value.startswith("."):
            raise ValueError(f"{value!r} must be a plain file-name prefix")
        return value


DCGM_BINDINGS_PATHS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3", "/usr/local/dcgm/bindings/python3")


class DcgmConfig(SourceConfig):
    enabled: bool = Field(
        False, description="Run this source (off by default: it needs DCGM, or a dcgm-exporter on the node).")
    interval: Duration = Field(
        1.0, description="How often the source collects; with mode=bindings also DCGM's sampling period.")
    mode: Literal["bindings", "exporter"] = Field(
        "bindings", description="bindings: DCGM's Python bindings and its host engine; exporter: read the "
        "DCGM_FI_PROF_* series of a dcgm-exporter running on the node.")
    bindings_path: str = Field(
        "", description="Directory holding DCGM's Python bindings (pydcgm.py); empty: the first of "
        + " and ".join(DCGM_BINDINGS_PATHS) + " that exists.")
    hostengine: str = Field(
        "localhost", description="For mode=bindings, the nv-hostengine to connect to: HOST or HOST:PORT "
        "(TCP, port 5555 by default), unix:PATH (its Unix socket), or embedded (start DCGM's engine "
        "inside this process; needs root for profiling fields).")
    exporter_url: str = Field(
        "http://127.0.0.1:9400/metrics", description="For mode=exporter, the /metrics URL of the dcgm-exporter "
        "on this node; series are matched to this node's GPUs by UUID.")

    @field_validator("hostengine")
    @classmethod
    def _check_hostengine(cls, value: str) -> str:
        if not value or (value.startswith("unix:") and len(value) == len("unix:")):
            raise ValueError(f"{value!r}: want HOST, HOST:PORT, unix:PATH or embedded")
        return value

    @field_validator("exporter_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value


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
        from .attribution.podlabels import prometheus_label, valid_label_key

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
        from .attribution.k8s_names import SUBDOMAIN

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


class ProcessConfig(SourceConfig):
    interval: Duration = Field(5.0, description="How often the source collects.")


FaultKind = Literal["lost", "xid", "ecc", "throttle", "hang", "raise"]


class FaultSpec(_Section):
    at: Duration = Field(description="Seconds after start when the fault is injected.")
    gpu: int = Field(0, ge=0, description="GPU index.")
    kind: FaultKind
    xid: int = Field(79, ge=0, description="XID code for kind=xid.")
    count: int = Field(1, ge=1, description="Number of errors for kind=ecc / xid.")
    uncorrected: bool = Field(False, description="For kind=ecc: uncorrected errors.")
    reason: Literal["power", "thermal"] = Field("thermal", description="For kind=throttle.")
    duration: Duration = Field(30.0, description="How long a throttle or hang lasts.")


def _simulate_shorthand(value: Any) -> Any:
    if isinstance(value, int | str) and not isinstance(value, bool):
        return {"gpus": value}
    return value


class SimulateConfig(_Section):
    gpus: int = Field(0, ge=0, le=1024, description="Simulated GPUs instead of NVML; 0 uses real NVML.")
    seed: int = Field(1, description="Seed of the simulated workload, for repeatable runs.")
    pattern: Literal["training", "square"] = Field(
        "training", description="training: compute bursts, data stalls, checkpoint pauses; "
        "square: busy/idle alternating exactly.")
    busy: Duration = Field(0.1, description="Busy time per cycle for pattern=square.")
    idle: Duration = Field(0.1, description="Idle time per cycle for pattern=square.")
    faults: list[FaultSpec] = Field(default_factory=list, description="Faults injected on a schedule.")

    @model_validator(mode="after")
    def _faults_name_simulated_gpus(self) -> SimulateConfig:
        for i, fault in enumerate(self.faults):
            if fault.gpu >= self.gpus:
                raise ValueError(f"faults.{i}.gpu: GPU {fault.gpu} is not simulated (gpus: {self.gpus})")
        return self


class Config(_Section):
    web: WebConfig = Field(default_factory=WebConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    nvml: NvmlConfig = Field(default_factory=NvmlConfig)
    dcgm: DcgmConfig = Field(default_factory=DcgmConfig)
    host: HostConfig = Field(default_factory=HostConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    flight: FlightConfig = Field(default_factory=FlightConfig)
    kubelet: KubeletConfig = Field(default_factory=KubeletConfig)
    process: ProcessConfig = Field(default_factory=ProcessConfig)
    simulate: Annotated[SimulateConfig, BeforeValidator(_simulate_shorthand)] = Field(
        default_factory=SimulateConfig)

    def sources(self) -> dict[str, SourceConfig]:
        return {"nvml": self.nvml, "dcgm": self.dcgm, "host": self.host, "ingest": self.ingest,
                "flight": self.flight, "kubelet": self.kubelet, "process": self.process}


def _scalar_fields(model: type[BaseModel]) -> list[str]:
    """Keys that can be set from a flag or env variable (not lists or nested models)."""
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            continue
        if getattr(annotation, "__origin__", None) is list:
            continue
        out.append(name)
    return out


def settable_keys() -> list[tuple[str, str, Any]]:
    """(section, key, FieldInfo) for every key a flag or env variable may set."""
    keys = []
    for section, field in Config.model_fields.items():
        model = field.default_factory().__class__  # type: ignore[misc]
        for key in _scalar_fields(model):
            keys.append((section, key, model.model_fields[key]))
    return keys


def flag_name(section: str, key: str) -> str:
    return f"--{section}.{key.replace('_', '-')}"


def env_name(section: str, key: str) -> str:
    return f"{ENV_PREFIX}{section.upper()}_{key.upper()}"


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    known = {env_name(s, k): (s, k) for s, k, _ in settable_keys()}
    known[f"{ENV_PREFIX}SIMULATE"] = ("simulate", "gpus")
    out: dict[str, dict[str, str]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name == f"{ENV_PREFIX}CONFIG" or _SERVICE_LINK.match(name):
            continue
        if name not in known:
            raise ConfigError(f"unknown environment variable {name} (known: see docs/configuration.md)")
        section, key = known[name]
        out.setdefault(section, {})[key] = value
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        elif isinstance(value, Mapping) and key == "simulate" and merged.get(key) is not None:
            merged[key] = _merge(_simulate_shorthand(merged[key]), value)
        else:
            merged[key] = value
    return merged


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping of sections")
    return data


def _describe(error: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in error["loc"] if not str(p).startswith("function-"))
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    return f"{loc or '(top level)'}: {message}"


def load(
    path: str | os.PathLike[str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the effective config: defaults < file < environment < flags."""
    environ = os.environ if environ is None else environ
    path = path or environ.get(f"{ENV_PREFIX}CONFIG") or None
    data: dict[str, Any] = read_file(path) if path else {}
    data = _merge(data, env_overrides(environ))
    data = _merge(data, flags or {})
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None
