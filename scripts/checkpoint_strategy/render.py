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
import marshal
import math
import os
import re
import stat
import sys
from functools import lru_cache
from typing import Any, Optional

from markupsafe import Markup

from checkpoint_strategy import storage
from checkpoint_strategy.atomic import atomic_write_bytes
from checkpoint_strategy.resources import data_dir
from checkpoint_strategy.storage import read_bytes

_CACHE_MAGIC = b"checkpoint-strategy jinja bytecode 1\n"


def _cache_dir() -> Optional[str]:
    """The user's cache folder for compiled templates, or None (then templates compile each run).

    $XDG_CACHE_HOME or ~/.cache, one subfolder per Jinja and Python version. Used only when it is a
    folder this user owns that nobody else can write to (compiled code is executed, like a .pyc)."""
    import jinja2

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(
        base,
        "checkpoint-strategy",
        f"jinja{jinja2.__version__}-py{sys.version_info[0]}{sys.version_info[1]}",
    )
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    owner_ok = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    if (
        not stat.S_ISDIR(st.st_mode)
        or not owner_ok
        or st.st_mode & 0o022
        or not os.access(path, os.W_OK)
    ):
        return None
    return path


def _bytecode_cache():
    """A Jinja bytecode cache that never fails a command: unreadable, unwritable or damaged cache
    files are ignored (the template is compiled as without a cache). No pickle: the file is a
    magic line, the template source checksum and marshalled code."""
    import jinja2

    folder = _cache_dir()
    if folder is None:
        return None

    class SafeCache(jinja2.BytecodeCache):
        def _file(self, bucket) -> str:
            return os.path.join(folder, bucket.key + ".jbc")

        def load_bytecode(self, bucket) -> None:
            head = _CACHE_MAGIC + bucket.checksum.encode("ascii") + b"\n"
            try:
                data = read_bytes(self._file(bucket), "template cache", limit=8 << 20)
                if data.startswith(head):
                    bucket.code = marshal.loads(data[len(head) :])
            except Exception:  # noqa: BLE001 - a damaged cache only costs a compile
                bucket.reset()

        def dump_bytecode(self, bucket) -> None:
            head = _CACHE_MAGIC + bucket.checksum.encode("ascii") + b"\n"
            try:
                atomic_write_bytes(self._file(bucket), head + marshal.dumps(bucket.code))
            except Exception:  # noqa: BLE001 - read-only or full disk: no cache, same output
                pass

    return SafeCache()


@lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        bytecode_cache=_bytecode_cache(),
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
    env.filters["bytes"] = fmt_bytes
    env.filters["tojson"] = lambda v: Markup(json.dumps(v))
    env.filters["trusted"] = trusted
    env.filters["py"] = python_literal
    env.filters["esc"] = escape_untrusted
    return env


_UNSAFE = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029|`]|<!--|-->")
_NAMED = {
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "|": "\\|",
    "`": "\\x60",
    "<!--": "\\x3c!--",
    "-->": "--\\x3e",
}


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


def python_literal(value: Any) -> Markup:
    """A value written into generated Python code (recover's resume snippets): its repr, printed as is."""
    return Markup(repr(value))


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


def fmt_bytes(value: Any) -> str:
    """A byte count for people: 1.2 GB, 410 KB, 12 B (decimal units, like the plan's GB)."""
    if value is None:
        return "unknown"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{int(value)} B"


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
    "ConvertReport": ("convert", "c"),
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


def emit(
    report: Any, fmt: str = "text", output: Any = None, inputs: tuple = (), **context: Any
) -> None:
    """Render a report and write it to stdout, or whole to `output` (-o/--output FILE), which may
    not be one of the command's `inputs`."""
    write_output(render(report, fmt, **context), output, inputs)


def check_output_early(output: Any, inputs: tuple = ()) -> None:
    """Refuse -o/--output over an input, or inside an input folder, before the command does any work
    (deletes, state writes), and a FIFO output that nobody reads (opened now, kept for the write);
    `write_output` checks the same again when it writes."""
    if output is not None and output != "-":
        storage.check_output(output, "-o/--output", inputs=tuple(i for i in inputs if i))
        storage.hold_output(output, "-o/--output")


def write_output(text: str, output: Any = None, inputs: tuple = ()) -> None:
    """stdout for no -o (or -o -); else storage.write_output: atomic, never over an input, one line on failure."""
    if output is None or output == "-":
        sys.stdout.write(text)
        return

    storage.write_output(output, text, "-o/--output", inputs=tuple(i for i in inputs if i))


def to_json(data: Any) -> str:
    """`json.dumps(data, indent=2, allow_nan=False)` and a newline, the same characters (tests/test_render_json.py
    compares the two on generated documents). The standard library's encoder runs in C only without `indent`; its
    pure-Python indenting path costs ~4x the C one on a 2,000-checkpoint report, so JSON data (dict, list, str,
    int, float, bool, None) is laid out here with the C string escaper, and anything else (a non-str key, a
    non-finite float, another type) goes to json.dumps whole: its output, or its error."""
    try:
        parts: list[str] = []
        _layout(data, "\n", parts.append)
        return "".join(parts) + "\n"
    except _NotPlain:
        return json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n"


class _NotPlain(Exception):
    """`_layout` met something only json.dumps words right."""


_escape = json.encoder.encode_basestring_ascii  # the C escaper json.dumps uses (ensure_ascii)
_float_repr = float.__repr__
_int_repr = int.__repr__


def _scalar(o: Any, t: type) -> str | None:
    """A JSON scalar as json.dumps writes it; None for a container; _NotPlain for anything else."""
    if t is str:
        return _escape(o)
    if t is int:
        return _int_repr(o)
    if o is None:
        return "null"
    if o is True:
        return "true"
    if o is False:
        return "false"
    if t is float and o - o == 0.0:  # finite (nan and inf: json.dumps raises)
        return _float_repr(o)
    if t is dict or t is list or t is tuple:
        return None
    raise _NotPlain


def _layout(o: Any, newline: str, out) -> None:
    """One value at the indent `newline` holds ("\n" and two spaces a level), as json.dumps(indent=2) lays it;
    the scalars in a container are written with their key or separator in one piece. The dict and list loops
    are written out twice on purpose: one loop over (key, value) pairs for both costs ~35% more."""
    t = type(o)
    if t is dict:
        if not o:
            out("{}")
            return
        inner = newline + "  "
        sep = "{" + inner
        for k, v in o.items():
            if type(k) is not str:
                raise _NotPlain
            tv = type(v)
            text = _escape(v) if tv is str else _scalar(v, tv)
            if text is None:
                out(sep + _escape(k) + ": ")
                _layout(v, inner, out)
            else:
                out(sep + _escape(k) + ": " + text)
            sep = "," + inner
        out(newline + "}")
    elif t is list or t is tuple:
        if not o:
            out("[]")
            return
        inner = newline + "  "
        sep = "[" + inner
        for v in o:
            tv = type(v)
            text = _escape(v) if tv is str else _scalar(v, tv)
            if text is None:
                out(sep)
                _layout(v, inner, out)
            else:
                out(sep + text)
            sep = "," + inner
        out(newline + "]")
    else:
        out(_scalar(o, t))  # (a scalar: containers are handled above)


def to_yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
