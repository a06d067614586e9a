"""DeepSpeed ZeRO per-rank files -> consolidated fp32 weights (what zero_to_fp32 does), read as data."""

from __future__ import annotations


from checkpoint_strategy.convert.pieces import Loaded
from checkpoint_strategy.errors import UsageError


def is_zero_folder(src: str, names: set[str]) -> bool:
    return any(n.endswith("_optim_states.pt") or n.endswith("model_states.pt") for n in names)


def read_zero(src: str) -> Loaded:
    raise UsageError(f"{src}: DeepSpeed ZeRO conversion is not implemented yet")
