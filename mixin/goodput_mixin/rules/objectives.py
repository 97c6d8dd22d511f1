"""Which latency objectives apply to which engine and model, and the check that each threshold is a bucket bound
of the default buckets of the histogram it is judged on (so that attainment is a count, not an interpolation; a
scrape with other buckets is judged at the bound below, see inference.py)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from .engines import ENGINES

if TYPE_CHECKING:
    from .settings import Objectives, RulesSettings

# objective -> (its field in Objectives, the normalized histogram that judges it)
OBJECTIVES = {"ttft": ("ttft_seconds", "time_to_first_token"), "tpot": ("tpot_seconds", "time_per_output_token")}


def resolve(s: RulesSettings, engine: str, model: str | None = None) -> Objectives:
    """inference_slo, then inference_slo_engines[engine], then the overrides naming only `engine`, then those naming
    `model` (of `engine` or of any)."""
    values = s.inference_slo.model_dump()
    entries = [part for name, part in s.inference_slo_engines.items() if name == engine]
    entries += [o for o in s.inference_slo_overrides if o.model is None and o.engine == engine]
    if model is not None:
        entries += [o for o in s.inference_slo_overrides if o.model == model and o.engine in (None, engine)]
    for entry in entries:
        values.update({k: v for k, v in entry.model_dump(
            include={"ttft_seconds", "tpot_seconds", "target", "unjudged"}).items() if v is not None})
    return type(s.inference_slo).model_validate(values)


def models(s: RulesSettings, engine: str) -> list[str]:
    """The models with objectives of their own on `engine`, in the order the settings name them."""
    named = [o.model for o in s.inference_slo_overrides if o.model is not None and o.engine in (None, engine)]
    return list(dict.fromkeys(named))


def unjudged(s: RulesSettings) -> list[str]:
    """Matchers (without braces) of the workload-level series of each objective declared unjudged (`unjudged` in
    inference_slo, inference_slo_engines or inference_slo_overrides): per engine, its models but those whose own
    entry judges the objective again, and each model whose own entry declares it where its engine does not. Few and
    short: an engine's name, and the models named in the overrides."""
    out = []
    for name in s.inference_engines:
        named = models(s, name)
        default = resolve(s, name).unjudged
        for objective in OBJECTIVES:
            engine = f'objective="{objective}", engine="{name}"'
            own = [m for m in named if (objective in resolve(s, name, m).unjudged) != (objective in default)]
            if objective in default:
                out.append(engine + (f', model!~"{_alternatives(own)}"' if own else ""))
            else:
                out += [f'{engine}, model="{_escape(m)}"' for m in own]
    return out


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _alternatives(names: list[str]) -> str:
    return _escape("|".join(re.escape(n) for n in names))


def bound(buckets: tuple[float, ...], threshold: float) -> float | None:
    """The bucket bound equal to `threshold` (to a relative 1e-9, so 0.1 written in YAML finds 0.1), else None."""
    return next((b for b in buckets if math.isclose(b, threshold, rel_tol=1e-9)), None)


def _near(buckets: tuple[float, ...], threshold: float) -> str:
    below = [b for b in buckets if b < threshold][-2:]
    above = [b for b in buckets if b > threshold][:2]
    return ", ".join(f"{b!r}" for b in (*below, *above))


def check_objectives(s: RulesSettings) -> None:
    """Raise ValueError naming the first threshold that is not a bucket bound, with the bounds that exist."""
    for name in s.inference_slo_engines:
        if name not in ENGINES:
            raise ValueError(f"inference_slo_engines: unknown engine {name!r}; known: {sorted(ENGINES)}")
    for entry in s.inference_slo_overrides:
        if entry.engine is not None and entry.engine not in ENGINES:
            raise ValueError(f"inference_slo_overrides: unknown engine {entry.engine!r}; known: {sorted(ENGINES)}")
    for name in s.inference_engines:
        engine = ENGINES[name]
        for model in [None, *models(s, name)]:
            objectives = resolve(s, name, model)
            for objective, (field, signal) in OBJECTIVES.items():
                threshold = getattr(objectives, field)
                for native in engine.signals.get(signal, ()):
                    # a histogram whose buckets are set per deployment (Triton's) has no default to check against
                    if native.buckets and bound(native.buckets, threshold * native.le_per) is None:
                        where = f"model {model!r} on {name}" if model else name
                        raise ValueError(
                            f"{objective} objective {threshold!r} s ({where}) is not a bucket bound of {native.name} "
                            f"(nearest bounds: {_near(native.buckets, threshold)}; all: "
                            f"{', '.join(repr(b) for b in native.buckets)}); attainment would be interpolated. "
                            "Pick a bound, or set that engine's in inference_slo_engines (a model's: name its engine "
                            "in inference_slo_overrides)")
