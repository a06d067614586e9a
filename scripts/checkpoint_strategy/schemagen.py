"""Generate schemas/*.schema.json from the pydantic models (`python -m checkpoint_strategy.schemagen`).

Every capability's models.py exposes SCHEMAS = {file name: model}. `--check` exits 1 when a
committed schema differs from its model (tests/test_schemas.py runs the same comparison).
"""

from __future__ import annotations

import importlib
import json
import sys

from checkpoint_strategy.atomic import atomic_write_text
from checkpoint_strategy.resources import data_dir

CAPABILITIES = (
    "planning",
    "simulation",
    "recovery",
    "formats",
    "integrations",
    "export",
    "convert",
)


def collect() -> dict[str, type]:
    found: dict[str, type] = {}
    for cap in CAPABILITIES:
        try:
            module = importlib.import_module(f"checkpoint_strategy.{cap}.models")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(f"checkpoint_strategy.{cap}"):
                continue
            raise
        found.update(getattr(module, "SCHEMAS", {}))
    return found


def render(model) -> str:
    schema = model.model_json_schema()
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    out = data_dir("schemas")
    stale = []
    for name, model in sorted(collect().items()):
        text = render(model)
        path = out / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not check:
            atomic_write_text(path, text)
    for name in stale:
        print(("stale: " if check else "wrote: ") + name)
    return 1 if (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
