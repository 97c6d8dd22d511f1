"""Configuration: YAML file, then `GOODPUT_*` environment variables, then flags; validated strictly.

The root model is assembled from the registry: `web`, `log`, one section per source (its settings model, from
its folder) and `simulate`. Every key has one spelling per layer, derived from the model:

    file   nvml: {interval: 1s}
    env    GOODPUT_NVML_INTERVAL=1s
    flag   --nvml.interval 1s

A list of strings is a YAML list in the file and comma-separated in a variable or flag
(GOODPUT_FLIGHT_PREFIXES=comm_lib_trace_rank_,nccl_trace_rank_).

Any error (unknown key, wrong type, bad duration) raises `ConfigError` naming the key; the CLI turns
that into exit code 2 before anything binds a port.

The layering is written here rather than with pydantic-settings: its environment source maps nested keys with a
delimiter (GOODPUT_NVML__INTERVAL, not GOODPUT_NVML_INTERVAL), ignores unknown variables instead of refusing
them, and its CLI source does not take `--nvml.interval` with argparse's help and exit codes as they are.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from goodput_client.contract import CAPTURES_ENV
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, create_model

from .core.settings import (
    ConfigError,
    LogConfig,
    Section,
    SourceConfig,
    WebConfig,
)
from .sources import SOURCES
from .sources.nvml.settings import FaultSpec, SimulateConfig, simulate_shorthand

__all__ = ["Config", "ConfigError", "FaultSpec", "env_name", "flag_name", "load", "settable_keys"]

ENV_PREFIX = "GOODPUT_"
# GOODPUT_* variables of the other tools, which the daemon leaves alone (an image or a shell may set them for all):
# the training client's captures switch and the Prometheus that `goodput-exporter diagnose` asks
OTHER_TOOLS_VARIABLES = frozenset({CAPTURES_ENV, "GOODPUT_PROMETHEUS_URL"})
# Kubernetes injects service links for a Service named goodput-exporter into every pod of the
# namespace (GOODPUT_EXPORTER_SERVICE_HOST, GOODPUT_EXPORTER_PORT_9445_TCP, ...): not ours, ignored.
_SERVICE_LINK = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_[A-Z]+)?)?)$")


class _Root(Section):
    def sources(self) -> dict[str, SourceConfig]:
        """Each source's section, in registry order."""
        return {spec.name: getattr(self, spec.name) for spec in SOURCES}


Config: type[_Root] = create_model(  # type: ignore[call-overload]
    "Config",
    __base__=_Root,
    web=(WebConfig, Field(default_factory=WebConfig)),
    log=(LogConfig, Field(default_factory=LogConfig)),
    **{spec.name: (spec.settings, Field(default_factory=spec.settings)) for spec in SOURCES},
    simulate=(Annotated[SimulateConfig, BeforeValidator(simulate_shorthand)], Field(default_factory=SimulateConfig)),
)


def _is_string_list(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is list and getattr(annotation, "__args__", None) == (str,)


def _scalar_fields(model: type[BaseModel]) -> list[str]:
    """Keys that can be set from a flag or env variable: not nested models, nor lists other than of strings (a
    list of strings takes a comma-separated value there)."""
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            continue
        if getattr(annotation, "__origin__", None) is list and not _is_string_list(annotation):
            continue
        out.append(name)
    return out


def split_list(value: str) -> list[str]:
    """A list of strings as a flag or env variable gives it: comma-separated, blanks around items dropped."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _split_lists(layer: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The comma-separated values of a flag or env layer, as lists for the keys that hold lists of strings."""
    lists = {(section, key) for section, key, field in settable_keys() if _is_string_list(field.annotation)}
    out: dict[str, Any] = {}
    for section, keys in layer.items():
        if isinstance(keys, Mapping):
            keys = {key: split_list(value) if (section, key) in lists and isinstance(value, str) else value
                    for key, value in keys.items()}
        out[section] = keys
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
        if (not name.startswith(ENV_PREFIX) or name == f"{ENV_PREFIX}CONFIG" or name in OTHER_TOOLS_VARIABLES
                or _SERVICE_LINK.match(name)):
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
            merged[key] = _merge(simulate_shorthand(merged[key]), value)
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
    data = _merge(data, _split_lists(env_overrides(environ)))
    data = _merge(data, _split_lists(flags or {}))
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None
