"""Checkpoint size from a parameter count or a weights size (GB = 10^9 bytes).

- fp32 training: 12 bytes/param = fp32 weights (4) + Adam's two moments (4 + 4): the spec's
  "model_params * 4 bytes (fp32) * 3" (1B params -> 12 GB).
- mixed precision: 14 bytes/param = bf16/fp16 weights (2) + fp32 master weights (4) + Adam m
  and v (4 + 4). This is the ZeRO paper's 16 bytes/param (Rajbhandari et al. 2020, sec. 3.1:
  2 + 2 + K with K = 12) minus the 2 bytes of fp16 gradients, which are not checkpointed.
- mixed precision without an fp32 master copy ("mixed-no-master"): 10 bytes/param = 16-bit
  weights (2) + Adam m and v in fp32 (4 + 4). OPT-175B trained this way: "we keep Adam state in
  FP32, since we shard it across all hosts, while the model weights remained in FP16" (Zhang et
  al. 2022, OPT, sec. 2.3); its published 175B checkpoints are about 1.6-1.75 TB.
- Without optimizer state a checkpoint is the weights alone (4 or 2 bytes/param).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from checkpoint_strategy.errors import UsageError

if TYPE_CHECKING:
    from checkpoint_strategy.planning.models import Precision

GB = 1e9
WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
STATE_BYTES = {"fp32": 12, "mixed": 14, "mixed-no-master": 10}

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_PARAMS_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*$")


def parse_params(text: str) -> float:
    """'7B' -> 7e9, '1.3e9' -> 1.3e9, '350M' -> 3.5e8, '125k' -> 1.25e5."""
    match = _PARAMS_RE.match(str(text))
    if not match:
        raise ValueError(f"expected a parameter count such as 7B, 350M or 1.3e9, got {text!r}")
    value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"expected a parameter count of at least 1, got {text!r}")
    return value


def resolve_params(
    params: float | None, model_size_gb: float | None, weights_dtype: str
) -> float | None:
    if params is not None and model_size_gb is not None:
        raise UsageError("give the model size once: either --model_size_gb or --params, not both")
    if params is not None:
        return params
    if model_size_gb is not None:
        return model_size_gb * GB / WEIGHT_BYTES[weights_dtype]
    return None


def resolve_precision(precision: Precision | None, weights_dtype: str) -> Precision:
    if precision is not None:
        return precision
    return "fp32" if weights_dtype == "fp32" else "mixed"


def checkpoint_gb(params: float, precision: str, save_optimizer: bool) -> float:
    per_param = STATE_BYTES[precision] if save_optimizer else (4 if precision == "fp32" else 2)
    return params * per_param / GB


def weights_gb(params: float, precision: str) -> float:
    """The inference export (safetensors): fp32 weights, or 16-bit weights for mixed precision."""
    return params * (4 if precision == "fp32" else 2) / GB
