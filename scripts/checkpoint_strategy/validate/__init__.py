"""Is a checkpoint whole? The level engine (quick / full / deep), the deep level's numeric pass, parts for
several processes, and the split of many checks over processes.

Python API for training scripts (the spec's ``validate_on_save``)::

    from checkpoint_strategy.validate import validate_checkpoint
    result = validate_checkpoint("out/checkpoint-500", level="quick")
    if result.status != "valid":
        ...  # result.problems: [{file, reason, kind}]

Resume checks (read as opcodes; verify-resume --checkpoints, and a callback at resume time)::

    from checkpoint_strategy.formats.optstep import read_optimizer_steps, judge
    judge(read_optimizer_steps("out/checkpoint-1200"), resume_step=1000).verdict   # "reset" when Adam restarted
    from checkpoint_strategy.formats.runshape import check_resume_shape
    check_resume_shape("out/checkpoint-1000", world_size=1)   # ["global batch changed ... accumulation to 2 ..."]

Nothing here imports torch, and no checkpoint content is ever executed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpoint_strategy.validate.engine import validate_checkpoint, validate_paths

__all__ = ["validate_checkpoint", "validate_paths"]


def __getattr__(name: str) -> Any:
    """The API comes from the engine when first used (PEP 562): importing a small module of this package (parts,
    coverage) does not load the engine and its imports."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from checkpoint_strategy.validate import engine

    value = getattr(engine, name)
    globals()[name] = value
    return value
