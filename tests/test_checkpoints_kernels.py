"""The compiled 16-bit kernels (formats/kernels.py, numba) against float64 sums computed here, on every
bit pattern, and the deep level's figures with them against the numpy path and against torch.

The oracle: numpy's own float16 type widened to float64, and bfloat16 bits shifted into float32 words
and widened to float64 (both exact), summed in float64.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from cliresult import checkout_env

from checkpoint_strategy.formats import tensors as tensorscan
from checkpoint_strategy.validate import validate_checkpoint, validate_paths

pytest.importorskip(
    "numba", reason="the compiled kernels need numba (the `fast` and `test` extras)"
)
BLOCK = (
    1024  # kernels.BLOCK (importing kernels at collection would compile numba for every test run)
)
ALL = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every 16-bit pattern


def _bf16_f64(bits: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _f16_f64(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float16).astype(np.float64)


@pytest.fixture(scope="module")
def kernels():
    from checkpoint_strategy.formats import kernels as compiled

    assert compiled.BLOCK == BLOCK
    return compiled


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_finite_pattern_squared_exactly_and_every_nonfinite_one_flagged(kernels, dtype):
    kernel, widen = (
        (kernels.bf16_sumsq, _bf16_f64) if dtype == "bfloat16" else (kernels.f16_sumsq, _f16_f64)
    )
    values = widen(ALL)
    finite = np.isfinite(values)
    # one value at a time: the kernel's square of each finite value is its exact float32 square
    fin_bits = ALL[finite]
    singles = np.array([kernel(fin_bits[i : i + 1]) for i in range(len(fin_bits))])
    with np.errstate(over="ignore"):
        expect = (values[finite].astype(np.float32) ** 2).astype(np.float64)
    small = np.isfinite(
        expect
    )  # beyond ~1.8e19 a float32 square overflows: the caller re-checks exactly
    np.testing.assert_array_equal(singles[small], expect[small])
    assert np.all(np.isinf(singles[~small]))
    # every NaN/Inf pattern alone, and hidden among finite values, makes the sum non-finite
    for b in ALL[~finite]:
        assert not np.isfinite(kernel(np.array([b], dtype=np.uint16))), hex(int(b))
        mixed = np.full(3000, 0x3C00 if dtype == "float16" else 0x3F80, dtype=np.uint16)  # 1.0
        mixed[1234] = b
        assert not np.isfinite(kernel(mixed)), hex(int(b))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("n", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 300_001])
def test_sums_within_2e_7_of_float64_on_random_data(kernels, dtype, n):
    kernel, widen = (
        (kernels.bf16_sumsq, _bf16_f64) if dtype == "bfloat16" else (kernels.f16_sumsq, _f16_f64)
    )
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.uniform(-3, 3))
    if dtype == "bfloat16":
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    else:
        bits = x.astype(np.float16).view(np.uint16)
    exact = float(np.sum(widen(bits) ** 2))
    got = kernel(bits)
    assert got == pytest.approx(exact, rel=2e-7, abs=0.0)  # float32 block sums: ~1 float32 ulp
    ro = bits.copy()
    ro.flags.writeable = False  # memory-mapped checkpoint bytes are read-only
    assert kernel(ro) == got


def test_subnormals_zeros_and_signs_of_float16(kernels):
    h = np.array(
        [0.0, -0.0, 2.0**-24, -(2.0**-24), 2.0**-14 * 0.5, 65504.0, -65504.0], dtype=np.float16
    )
    assert kernels.f16_sumsq(h.view(np.uint16)) == pytest.approx(
        float(np.sum(h.astype(np.float64) ** 2)), rel=1e-7
    )
    assert kernels.f16_sumsq(np.zeros(5000, dtype=np.uint16)) == 0.0


def _safetensors(path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    header, blobs, off = {}, [], 0
    for name, (code, arr) in tensors.items():
        raw = arr.tobytes()
        header[name] = {
            "dtype": code,
            "shape": list(arr.shape),
            "data_offsets": [off, off + len(raw)],
        }
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _figures(path, tmp_path, monkeypatch, compiled: bool) -> dict:
    monkeypatch.setattr(tensorscan, "KERNEL_MIN_BYTES", 0)
    monkeypatch.setenv("CHECKPOINT_STRATEGY_KERNELS", "on" if compiled else "off")
    stats = tmp_path / f"stats-{compiled}.json"
    validate_paths([str(path)], level="deep", stats=str(stats))
    return {t["tensor"]: t for t in json.loads(stats.read_text())["checkpoints"][0]["tensors"]}


def test_deep_level_figures_equal_the_numpy_path_and_torch(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    w = rng.standard_normal(200_003).astype(np.float32)
    bf = (w.view(np.uint32) >> 16).astype(np.uint16)
    bf[77] = 0x7FC0  # a bfloat16 NaN
    bf[150_000] = 0xFF80  # -Inf
    half = rng.standard_normal(70_001).astype(np.float16)
    half[5] = np.inf
    half[60_000] = np.nan
    clean = (rng.standard_normal(4097) * 1e-3).astype(np.float16)
    path = tmp_path / "model.safetensors"
    _safetensors(
        path,
        {
            "w.bf16": ("BF16", bf),
            "w.half": ("F16", half.view(np.uint16)),
            "w.clean": ("F16", clean.view(np.uint16)),
        },
    )
    compiled = _figures(path, tmp_path, monkeypatch, True)
    numpy_path = _figures(path, tmp_path, monkeypatch, False)
    from safetensors.torch import load_file

    loaded = load_file(str(path))
    for name, t in loaded.items():
        d = t.double()
        fin = d[torch.isfinite(d)]
        for fig in (compiled, numpy_path):
            f = fig[name]
            assert (f["nan"], f["inf"]) == (int(torch.isnan(d).sum()), int(torch.isinf(d).sum())), (
                name
            )
            assert f["l2"] == pytest.approx(float(torch.linalg.vector_norm(fin)), rel=1e-7), name
            assert f["max_abs"] == pytest.approx(float(fin.abs().max()), rel=0), name
    r = validate_checkpoint(path, level="deep")
    assert r.status == "invalid"


def test_kernels_off_in_the_environment_keeps_the_numpy_path(tmp_path):
    code = (
        "import sys; from checkpoint_strategy.formats import tensors as tensorscan;"
        "tensorscan.KERNEL_MIN_BYTES = 0; print(tensorscan.kernels(1 << 40) is None)"
    )
    for value, expect in (("off", "True"), ("", "False")):
        env = checkout_env()
        env["CHECKPOINT_STRATEGY_KERNELS"] = value
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == expect, (value, out.stderr)


def test_once_loaded_the_kernels_serve_small_scans_too(kernels, monkeypatch):
    monkeypatch.setattr(tensorscan, "KERNEL_MIN_BYTES", 0)
    assert tensorscan.kernels(1) is kernels  # loaded (cached in this process)
    monkeypatch.setattr(tensorscan, "KERNEL_MIN_BYTES", 1 << 62)
    assert tensorscan.kernels(1) is kernels  # a long-lived process keeps using them
    monkeypatch.setenv("CHECKPOINT_STRATEGY_KERNELS", "off")
    assert tensorscan.kernels(1 << 40) is None


def test_small_scans_never_import_numba(tmp_path):
    """Below KERNEL_MIN_BYTES the deep level stays on numpy: numba's ~1.2 s import would cost more than it saves."""
    path = tmp_path / "model.safetensors"
    _safetensors(path, {"w": ("BF16", np.zeros(1000, dtype=np.uint16))})
    code = (
        "import sys; from checkpoint_strategy.validate import validate_checkpoint;"
        "r = validate_checkpoint(sys.argv[1], level='deep'); print(r.status, 'numba' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        env=checkout_env(),
        capture_output=True,
        text=True,
        check=True,
        cwd=os.fspath(tmp_path),
    )
    assert out.stdout.split() == ["valid", "False"], out.stderr
