"""All human-readable output goes through Jinja2 templates in templates/ (StrictUndefined).

Every string a template prints passes through one filter, ``escape_untrusted`` (the
environment's ``finalize``), so a folder, file or zip-entry name cannot forge output: newlines and
other control characters become ``\\n``-style escapes (no forged line in the text report or in
NEXT_ACTION.md, which the next agent session reads), ``|`` becomes ``\\|`` (no forged table
cell), a backtick becomes ``\\x60`` (no escape from a `code span`), and HTML comment markers
become ``\\x3c!--`` / ``--\\x3e`` (no forged ``checkpoint-strategy:begin/end`` marker).
Text this package generated itself and that must keep its newlines (the policy YAML, the
ready-to-paste code, the handoff markers) is marked with the ``trusted`` filter or passed as
``markupsafe.Markup``.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any

from markupsafe import Markup

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
        finalize=_finalize,
    )
    env.filters["num"] = fmt_num
    env.filters["gb"] = fmt_gb
    env.filters["hours"] = fmt_hours
    env.filters["tojson"] = lambda v: Markup(json.dumps(v))
    env.filters["trusted"] = trusted
    env.filters["esc"] = escape_untrusted
    return env


_UNSAFE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029|`]|<!--|-->")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "|": "\\|", "`": "\\x60", "<!--": "\\x3c!--",
          "-->": "--\\x3e"}


def _escape_one(m: re.Match) -> str:
    s = m.group(0)
    if s in _NAMED:
        return _NAMED[s]
    code = ord(s)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_untrusted(value: Any) -> str:
    """A user-controlled string made safe to print in text and markdown (see the module doc)."""
    return _UNSAFE.sub(_escape_one, str(value))


def trusted(value: Any) -> Markup:
    """Mark text this package generated (multi-line YAML, code) as printed as is."""
    return Markup(value)


def _finalize(value: Any) -> Any:
    if isinstance(value, Markup):
        return str(value)
    if isinstance(value, str):
        return escape_untrusted(value)
    return value


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
