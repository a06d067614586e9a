"""The framework modules of formats/, one line each: the engine (validate/engine.py) checks a checkpoint through
the module that names its format, and knows no format by name. A new format: one module implementing
`formats.base.Format`, and one line here."""

from __future__ import annotations

from collections.abc import Callable

from checkpoint_strategy.formats import dcp, deepspeed, hf, lightning, megatron, orbax, torchfile
from checkpoint_strategy.formats.base import Checker, Format

MODULES: tuple[Format, ...] = (hf, dcp, deepspeed, lightning, megatron, orbax, torchfile)

#: format name -> its checker
CHECKERS: dict[str, Checker] = {name: fn for m in MODULES for name, fn in m.CHECKERS.items()}
#: the formats that are always a folder
FOLDER_FORMATS: tuple[str, ...] = tuple(name for m in MODULES for name in m.FOLDER_FORMATS)
#: tracker file beside checkpoints -> (format, the checkpoint name its text names, or None)
TRACKERS: dict[str, tuple[str, Callable[[str], str | None]]] = {
    t: v for m in MODULES for t, v in m.TRACKERS.items()
}
