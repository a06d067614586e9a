"""Find templates/ and schemas/ from a checkout (the skill folder) or an installed wheel."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    """Return the folder `templates` or `schemas`.

    A checkout keeps them at the skill root (scripts/checkpoint_strategy/../../NAME);
    a wheel carries them as checkpoint_strategy/_data/NAME.
    """
    for candidate in (_PKG.parent.parent / name, _PKG / "_data" / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the {name}/ folder of checkpoint-strategy")


def schema_path(name: str) -> Path:
    return data_dir("schemas") / name


@cache
def load_schema(name: str) -> dict:
    return json.loads(schema_path(name).read_text(encoding="utf-8"))
