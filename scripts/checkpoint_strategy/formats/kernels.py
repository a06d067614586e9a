"""Compiled sum-of-squares kernels for 16-bit tensors (the deep level's `tensorscan`), with numba.

Optional (`pip install 'checkpoint-strategy[fast]'`): this module imports numba at its top, and only
`tensorscan.kernels()` imports it (lazily); without numba, or when it cannot compile here, that returns None
and `tensorscan` keeps its numpy path (same figures, a third to a half of the speed on
bfloat16/float16: numpy needs a widening pass, a shift and a dot per chunk, each through memory; these
kernels read every value once and keep the rest in registers).

Each kernel returns the sum of the squares of its values as a float64, or a NaN/Inf when any value is
NaN or Inf (the caller then re-checks that chunk exactly, counting NaN and Inf). Squares are summed in
float32 over blocks of `BLOCK` values (the vectorised, exact-as-BLAS part) and the blocks in float64:
within about 1e-7 (one float32 rounding of each block sum; 5e-8 on the norm), checked against float64
sums in tests/test_checkpoints_kernels.py.

- bfloat16: the value is the top half of a float32, so `bits << 16` reinterpreted as float32 is exact,
  NaN and Inf included (they propagate through the sums; no fast-math flag that assumes finite values).
- float16: the bits reinterpreted as an LLVM `half` and extended to float32 (`fpext`), which is exact for
  every value, subnormals, Inf and NaN included; on x86 with F16C (and ARM with FP16) LLVM emits the
  vector conversion instruction (`vcvtph2ps`), 16 values an instruction; elsewhere a library call, slower
  but the same figures. (An earlier integer-only form, `(bits & 0x7fff) << 13` as float32 times 2**112
  plus a NaN-producing overflow term for Inf/NaN, ran at less than half the speed here.)

Compiled once per machine (numba's `cache=True`: next to this file in `__pycache__`, or numba's user
cache folder when that is not writable): about 2 s the first time, then about 1.2 s a process to import
numba and load them. So `tensorscan` imports this module only when a scan has at least
`tensorscan.KERNEL_MIN_BYTES` of 16-bit values; `CHECKPOINT_STRATEGY_KERNELS=off` keeps the numpy path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

BLOCK = 1024  # float32 partial sums of this many squares, added up in float64
_OPTS: dict[str, Any] = {
    "nogil": True,
    "cache": True,
    "error_model": "numpy",
    "boundscheck": False,
    # reordered sums and fused multiply-adds only: NaN and Inf still propagate
    "fastmath": {"reassoc", "contract"},
}
_SIGNATURES = [
    types.float64(types.Array(types.uint16, 1, "C", readonly=True)),
    types.float64(types.Array(types.uint16, 1, "C")),
]


def _bitcast_typer(typingctx: Any, bits: Any) -> Any:
    """Reinterpret uint32 bits as a float32 (no conversion): an LLVM bitcast."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


_as_float32: Any = intrinsic(_bitcast_typer)


def _half_typer(typingctx: Any, bits: Any) -> Any:
    """float16 bits (uint16) widened to float32: an LLVM bitcast to `half`, then `fpext` (exact)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


_half_as_float32: Any = intrinsic(_half_typer)


@njit(**_OPTS)
def _bf16_block(raw: Any) -> Any:
    acc = np.float32(0.0)
    for i in range(raw.size):
        v = _as_float32(np.uint32(raw[i]) << np.uint32(16))
        acc += v * v
    return acc


@njit(**_OPTS)
def _f16_block(raw: Any) -> Any:
    acc = np.float32(0.0)
    for i in range(raw.size):
        v = _half_as_float32(raw[i])
        acc += v * v
    return acc


@njit(_SIGNATURES, **_OPTS)
def bf16_sumsq(raw: Any) -> float:
    """Sum of squares of bfloat16 values (their uint16 bits); NaN/Inf when any value is."""
    s = 0.0
    for start in range(0, raw.size, BLOCK):
        s += _bf16_block(raw[start : start + BLOCK])
    return s


@njit(_SIGNATURES, **_OPTS)
def f16_sumsq(raw: Any) -> float:
    """Sum of squares of float16 values (their uint16 bits); NaN/Inf when any value is."""
    s = 0.0
    for start in range(0, raw.size, BLOCK):
        s += _f16_block(raw[start : start + BLOCK])
    return s
