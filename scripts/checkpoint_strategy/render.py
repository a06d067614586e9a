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


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"


def to_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
