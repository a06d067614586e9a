"""The deep level's numeric pass on raw bytes: the 16-bit fast paths against float64 references.

Edges the chunked bit tricks could break: a NaN in the last value of a chunk and the first of the next,
bfloat16 and float16 -Inf, float16 subnormals and zeros, lengths that are no multiple of the chunk (odd
ones included), bytes that are not 4-byte aligned, squares that overflow float32.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from checkpoint_strategy.formats import tensors as ts


def _bits(dtype: str, values) -> np.ndarray:
    """uint16 bit patterns of float values in bfloat16 (truncated) or float16."""
    v = np.asarray(values, dtype=np.float32)
    if dtype == "bfloat16":
        return (v.view(np.uint32) >> 16).astype(np.uint16)
    return v.astype(np.float16).view(np.uint16)


def _as_f64(dtype: str, bits: np.ndarray) -> np.ndarray:
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float64)
    return bits.astype(np.float64)


def _scan(tmp_path, dtype: str, raw: np.ndarray, pad: int = 0, want_max: bool = True) -> ts.Stat:
    path = tmp_path / "t.bin"
    path.write_bytes(b"\0" * pad + raw.tobytes() + b"\0" * 6)
    job = ts.Job(str(path), "t.bin", "w", "weights", dtype, pad, (len(raw),))
    out = ts.scan([job], want_max=want_max, workers=1)
    assert not out.problems, out.problems
    (st,) = out.stats
    return st


def _expect(st: ts.Stat, ref: np.ndarray, want_max: bool = True) -> None:
    fin = ref[np.isfinite(ref)]
    assert (st.nan, st.inf) == (int(np.isnan(ref).sum()), int(np.isinf(ref).sum()))
    assert st.l2 == pytest.approx(math.sqrt(float(np.dot(fin, fin))), rel=1e-6, abs=1e-30)
    if want_max:
        assert st.max_abs == (float(np.abs(fin).max()) if len(fin) else None)


def _values(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(n).astype(np.float32) * np.float32(0.02)
    v[::97] = 0.0
    v[1::101] = -0.0
    return v


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "n", [1, 2, 3, ts.CHUNK16 - 1, ts.CHUNK16, ts.CHUNK16 + 1, 2 * ts.CHUNK16 + 3]
)
@pytest.mark.parametrize("pad", [0, 2])
def test_16bit_norm_and_max_match_float64(tmp_path, dtype, n, pad):
    bits = _bits(dtype, _values(n))
    for want_max in (True, False):
        st = _scan(tmp_path, dtype, bits, pad=pad, want_max=want_max)
        assert st.checked and st.numel == n
        _expect(st, _as_f64(dtype, bits), want_max)


def test_float16_subnormals_zeros_and_extremes(tmp_path):
    n = ts.CHUNK16 + 5
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 0x0400, n, dtype=np.uint16)  # every subnormal pattern (and +0)
    bits[1::2] |= 0x8000  # negative subnormals, -0
    bits[7] = 0x7BFF  # 65504, the largest finite float16
    bits[8] = 0xFBFF  # -65504
    bits[9] = 0x0001  # 2**-24, the smallest subnormal
    ref = _as_f64("float16", bits)
    st = _scan(tmp_path, "float16", bits)
    _expect(st, ref)
    assert st.max_abs == 65504.0
    small = rng.integers(
        1, 0x0400, 4097, dtype=np.uint16
    )  # subnormals only: the scale must be exact
    st = _scan(tmp_path, "float16", small)
    assert st.sumsq == pytest.approx(float(np.sum(_as_f64("float16", small) ** 2)), rel=1e-6)


@pytest.mark.parametrize(
    "dtype,nan,inf,ninf",
    [("bfloat16", 0x7FC0, 0x7F80, 0xFF80), ("float16", 0x7E00, 0x7C00, 0xFC00)],
)
def test_16bit_nonfinite_at_chunk_boundaries_counted_exactly(tmp_path, dtype, nan, inf, ninf):
    n = 2 * ts.CHUNK16 + 3
    bits = _bits(dtype, _values(n, seed=2))
    c = ts.CHUNK16
    bits[c - 1] = nan  # last value of the first chunk
    bits[c] = nan | 0x8000  # first value of the second (a negative NaN)
    bits[c + 7] = ninf  # -Inf
    bits[n - 1] = inf  # last value of the tensor (in the odd tail chunk)
    bits[n - 2] = nan | 0x0001  # another NaN payload
    st = _scan(tmp_path, dtype, bits)
    assert (st.nan, st.inf) == (3, 2)
    _expect(st, _as_f64(dtype, bits))


def test_bfloat16_only_ninf_and_pad(tmp_path):
    bits = _bits("bfloat16", [1.0, -2.0, float("-inf")])
    st = _scan(tmp_path, "bfloat16", bits, pad=2)
    assert (
        (st.nan, st.inf) == (0, 1) and st.l2 == pytest.approx(math.sqrt(5.0)) and st.max_abs == 2.0
    )


def test_bfloat16_squares_beyond_float32_are_exact(tmp_path):
    v = np.full(ts.CHUNK16 + 2, 3e30, dtype=np.float32)  # finite bfloat16, square overflows float32
    v[::3] = -1e-30
    bits = _bits("bfloat16", v)
    st = _scan(tmp_path, "bfloat16", bits)
    _expect(st, _as_f64("bfloat16", bits))
    assert math.isfinite(st.sumsq) and st.nan == st.inf == 0


def test_float32_nan_in_last_value_of_a_chunk(tmp_path):
    v = _values(2 * ts.CHUNK_ELEMS + 1, seed=3)
    v[ts.CHUNK_ELEMS - 1] = np.nan
    v[-1] = -np.inf
    st = _scan(tmp_path, "float32", v)
    assert (st.nan, st.inf) == (1, 1)
    _expect(st, v.astype(np.float64))
