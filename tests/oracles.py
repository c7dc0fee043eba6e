"""Reference implementations the tests compare graphs with (NumPy, float64 math): never used by rope_passes itself."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rope_passes.analysis.mrope import axis_of_columns


def mrope_reference(
    x: np.ndarray,
    positions: np.ndarray,
    cos_cache: np.ndarray,
    sin_cache: np.ndarray,
    *,
    sections: Sequence[int],
    layout: int,
    num_heads: int,
    interleaved: bool = False,
    rotary_dim: int | None = None,
) -> np.ndarray:
    """NumPy mRoPE of ``x`` [B, S, heads*head] with ``positions`` [3, B, S] (the MRotaryEmbedding contract)."""
    b, s, hidden = x.shape
    head = hidden // num_heads
    half = cos_cache.shape[1]
    rot = rotary_dim or 2 * half
    axis = axis_of_columns(sections, layout, half)
    cols = np.arange(half)[:, None, None]
    cos = cos_cache[positions[axis], cols].transpose(1, 2, 0)[:, :, None, :].astype(np.float64)  # [B,S,1,half]
    sin = sin_cache[positions[axis], cols].transpose(1, 2, 0)[:, :, None, :].astype(np.float64)
    xh = x.reshape(b, s, num_heads, head).astype(np.float64)
    out = xh.copy()
    if interleaved:
        x1, x2 = xh[..., 0:rot:2], xh[..., 1:rot:2]
        out[..., 0:rot:2] = x1 * cos - x2 * sin
        out[..., 1:rot:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = xh[..., :half], xh[..., half:rot]
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:rot] = x2 * cos + x1 * sin
    return out.reshape(b, s, hidden).astype(x.dtype)

