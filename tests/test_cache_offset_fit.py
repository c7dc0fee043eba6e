"""``annotate-cache-offset``'s table fit at real size: Phi-3-mini-128k's concatenated cache (4096 short + 131072 long
rows) as the builder computes it (float32 angles), accepted; the same rows split at any other offset, refused.

Reference: the table is built here with NumPy the way onnxruntime-genai's builder does it
(``outer(arange(rows, float32), inv_freq float32)``, then cos/sin times the LongRoPE attention factor, float32), not by
any code of the pass. The angle at row 131072 carries ~4e-3 rad of float32 rounding, 40x the 1e-4 value tolerance a
fit without the angle term allowed (it refused every real-size Phi-3-128k cache).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
import pytest

from rope_passes.proofs.concat_offset import ROW_TOLERANCE, fit_frequencies

HEAD, THETA, ORIGINAL, CONTEXT = 96, 10000.0, 4096, 131072
SHORT = np.round(np.linspace(1.0, 1.19, HEAD // 2), 4)
LONG = np.round(np.geomspace(1.08, 60.0, HEAD // 2), 4)


def builder_table(rows: int, factors: np.ndarray, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    inv = (1.0 / (factors * THETA ** (np.arange(0, HEAD, 2, dtype=np.float32) / HEAD))).astype(np.float32)
    freqs = np.outer(np.arange(rows, dtype=np.float32), inv)  # float32, as the builder's torch.outer
    scale = math.sqrt(1 + math.log(CONTEXT / ORIGINAL) / math.log(ORIGINAL))
    return (np.cos(freqs) * scale).astype(dtype), (np.sin(freqs) * scale).astype(dtype)


@pytest.fixture(scope="module")
def concat() -> tuple[np.ndarray, np.ndarray]:
    short, long = builder_table(ORIGINAL, SHORT), builder_table(CONTEXT, LONG)
    return np.concatenate([short[0], long[0]]), np.concatenate([short[1], long[1]])


def test_float32_angle_rounding_is_real(concat):
    """The premise: the builder's last rows differ from exact float64 RoPE by more than the value tolerance."""
    cos, _ = concat
    inv = 1.0 / (LONG * THETA ** (np.arange(0, HEAD, 2) / HEAD))
    scale = float(cos[ORIGINAL, 0])
    exact = scale * np.cos(np.arange(CONTEXT - 1024, CONTEXT)[:, None] * inv)
    assert np.abs(exact - cos[-1024:]).max() > 10 * ROW_TOLERANCE[ir.DataType.FLOAT]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_builder_cache_fits_both_halves(dtype):
    tol = ROW_TOLERANCE[ir.DataType.FLOAT if dtype == np.float32 else ir.DataType.FLOAT16]
    short, long = builder_table(ORIGINAL, SHORT, dtype), builder_table(CONTEXT, LONG, dtype)
    cos, sin = np.concatenate([short[0], long[0]]), np.concatenate([short[1], long[1]])
    fit_s = fit_frequencies(cos, sin, range(ORIGINAL), tol)
    fit_l = fit_frequencies(cos, sin, range(ORIGINAL, ORIGINAL + CONTEXT), tol)
    assert fit_s.excess <= 1.0 and fit_l.excess <= 1.0, (fit_s, fit_l)
    inv = 1.0 / (THETA ** (np.arange(0, HEAD, 2) / HEAD))
    # the recovered frequencies are the factors': float32 inv_freq is within 6e-8 and the slope over thousands of rows
    # averages the value rounding (float16: ~5e-4 per value, over 4096 short rows: a few 1e-6 relative)
    rtol = 1e-6 if dtype == np.float32 else 2e-5
    np.testing.assert_allclose(fit_s.w, inv / SHORT, rtol=rtol)
    np.testing.assert_allclose(fit_l.w, inv / LONG, rtol=rtol)


@pytest.mark.parametrize("shift", [-64, -1, 1, 64])
def test_a_misplaced_split_is_refused(concat, shift):
    """Split at ORIGINAL + shift: one half holds rows of the other factor set, off by far more than allowed."""
    cos, sin = concat
    tol = ROW_TOLERANCE[ir.DataType.FLOAT]
    at = ORIGINAL + shift
    worst = max(fit_frequencies(cos, sin, range(at), tol).excess,
                fit_frequencies(cos, sin, range(at, ORIGINAL + CONTEXT), tol).excess)
    assert worst > 5.0, worst


def test_one_row_out_of_place_is_refused(concat):
    cos, sin = (t.copy() for t in concat)
    cos[ORIGINAL + 100_000] = cos[ORIGINAL + 7]
    fit = fit_frequencies(cos, sin, range(ORIGINAL, ORIGINAL + CONTEXT), ROW_TOLERANCE[ir.DataType.FLOAT])
    assert fit.excess > 5.0 and fit.row == 100_000, fit
