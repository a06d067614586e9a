"""All human-readable output goes through Jinja2 templates in templates/ (StrictUndefined)."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from typing import Any

from checkpoint_strategy.resources import data_dir


@lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt_num
    env.filters["gb"] = fmt_gb
    env.filters["hours"] = fmt_hours
    env.filters["tojson"] = lambda v: json.dumps(v)
    return env


def render_template(name: str, **context: Any) -> str:
    return _env().get_template(name).render(**context)


def fmt_num(value: Any, digits: int = 2) -> str:
    """Format a number compactly: integers without decimals, floats trimmed."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}".replace(",", "")
    if not math.isfinite(value):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
    if text in ("0", "-0") and value != 0:
        return f"{value:.2g}"
    return text


def fmt_gb(value: Any) -> str:
    return "unknown" if value is None else f"{fmt_num(value, 1)} GB"


def fmt_hours(value: Any) -> str:
    if value is None:
        return "unknown"
    if value < 1:
        return f"{fmt_num(value * 60, 1)} min"
    return f"{fmt_num(value, 2)} h"


# report model (class name) -> (template stem, the name the template calls it). Text renders
# <stem>.txt.j2, markdown <stem>.md.j2; json is the model itself; yaml is the policy a report holds.
TEMPLATES: dict[str, tuple[str, str]] = {
    "PlanReport": ("report", "plan"),
    "SimulationReport": ("simulate", "sim"),
    "TradeoffsReport": ("tradeoffs", "t"),
    "RecoveryReport": ("recover", "r"),
    "VerifyResumeReport": ("verify-resume", "r"),
    "ValidationReport": ("validate", "report"),
    "PruneReport": ("prune", "report"),
    "SessionHandoff": ("handoff", "h"),
    "ReleaseGate": ("release-gate", "g"),
    "EmergencyDecision": ("on-event", "d"),
}


def render(report: Any, fmt: str = "text", **context: Any) -> str:
    """One report (a pydantic model) in one format: text/markdown through its template (which
    receives the model), json from the model, yaml for the `checkpoint_policy:` a report holds."""
    if fmt == "json":
        return to_json(report.model_dump(mode="json"))
    if fmt == "yaml":
        return render_template("policy.yaml.j2", policy=report.policy)
    stem, name = TEMPLATES[type(report).__name__]
    suffix = "md" if fmt == "markdown" else "txt"
    return render_template(f"{stem}.{suffix}.j2", **{name: report}, **context)


def emit(report: Any, fmt: str = "text", output: Any = None, **context: Any) -> None:
    """Render a report and write it to stdout, or atomically to `output` (-o/--output FILE)."""
    write_output(render(report, fmt, **context), output)


def write_output(text: str, output: Any = None) -> None:
    import sys

    if not output or output == "-":
        sys.stdout.write(text)
        return
    from checkpoint_strategy.atomic import atomic_write_text
    from checkpoint_strategy.errors import UsageError
    from checkpoint_strategy.storage import oserror_line

    try:
        atomic_write_text(output, text)
    except OSError as exc:
        raise UsageError(oserror_line(exc, "write", output)) from None


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"


def to_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
