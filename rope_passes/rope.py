"""What one rotary embedding computes, as transformers computes it: :class:`Rope` (built from a Hugging Face config by
:meth:`rope_passes.hf_config.HFConfig.rope`).

**Tables.** :meth:`Rope.inv_freq` repeats transformers' float32 arithmetic operation by operation
(``1 / base ** (arange(0, dim, 2) / dim)``, then the type's scaling), so the inverse frequencies and the angles
``position × inv_freq`` are bit-identical to transformers' (4.57 and 5.23, checked against
``tests/fixtures/hf_rope``). cos/sin are the correctly rounded values of those angles (float64 cos/sin rounded to
float32): transformers' own float32 cos/sin come from the CPU's vector math library (MKL on the reference machine)
and differ from the correctly rounded ones by at most one float32 ulp in ~6% of the entries.

**Dynamic rope types** (``dynamic``: NTK scaling chosen from the call's largest position) are refused with the
reason: no table is right for every call. Asked for (``rope(dynamic=True)``), the conformance model has them:
:meth:`Rope.dynamic_inv_freq` is what transformers uses for a call of a given length (the default frequencies up to
``max_position_embeddings``, which are also the kind's :meth:`Rope.inv_freq` and :meth:`Rope.tables`).

**Conformance** (what each layer must rotate by, the per-layer lint RP404): :meth:`HFConfig.layer_rope` is layer
``i``'s rope or None for a layer without RoPE (SmolLM3's ``no_rope_layers``), its layer type's own table and theta
(Gemma 3 sliding/full, from ``layer_types`` or transformers 4's ``sliding_window_pattern``); :attr:`Rope.interleaved`
says whether transformers rotates pairs ``(2i, 2i+1)`` (Cohere, ERNIE 4.5, GPT-J, CodeGen, GLM, Helium) or halves
``(i, i + d/2)``, and :attr:`Rope.table_interleaved` whether its cos/sin module already repeats each frequency twice
(Cohere; GPT-J's sincos buffer and the others repeat later). GPT-J's names (``n_positions``, ``n_embd``,
``n_head``, ``rotary_dim``) and GPT-NeoX's ``rotary_pct`` are read. :meth:`Rope.tolerance` bounds what a correct
producer can differ by, from float32 rounding: torch's float32 ``pow`` (Sleef, 1 ulp) is not correctly rounded (it
differs from the correctly rounded power in ~1 of 30 dimensions, e.g. dims 6 and 10 of GPT-OSS's YaRN), so each
inverse frequency may be a few ulps off, which grows with the position (``p × ulp(inv_freq)``), plus the angle's and
cos/sin's own rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: rope types with one fixed table (LongRoPE: two, switched by the call's largest position)
STATIC_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
#: inverse-frequency ulps a correct producer may differ by (float32 pow is ~1 ulp in torch/Sleef, then 1/x, scaling)
INV_FREQ_ULPS = 3
#: value ulps for cos/sin evaluation and the attention-scaling product (each side ~1 ulp)
VALUE_ULPS = 4

_F = np.float32


@dataclasses.dataclass(frozen=True)
class Rope:
    """One rotary embedding as the config defines it (one per layer type for Gemma3)."""

    kind: str  # default | linear | llama3 | yarn | longrope
    theta: float
    head_dim: int
    partial_rotary_factor: float
    max_position_embeddings: int
    params: Mapping[str, Any]
    layer_type: str | None = None
    interleaved: bool = False  # transformers rotates pairs (2i, 2i+1), not halves
    table_interleaved: bool = False  # its rotary module repeats each frequency twice (Cohere) instead of cat(f, f)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def original_max(self) -> int | None:
        """LongRoPE's (llama3's, yarn's) ``original_max_position_embeddings``."""
        value = self.params.get("original_max_position_embeddings")
        return int(value) if value else None

    @property
    def switches(self) -> bool:
        """True for LongRoPE: short factors while the call's largest position + 1 <= original, long ones after."""
        return self.kind == "longrope"

    def _factor(self) -> float:
        factor = self.params.get("factor")
        if factor is None and self.original_max:
            factor = self.max_position_embeddings / self.original_max
        return float(factor if factor is not None else 1.0)

    @property
    def attention_scaling(self) -> float:
        """What transformers multiplies cos/sin by (yarn's and LongRoPE's attention factor; 1 for the others)."""
        given = self.params.get("attention_factor")
        if self.kind == "yarn":
            if given is not None:
                return float(given)
            factor, mscale, mscale_all = self._factor(), self.params.get("mscale"), self.params.get("mscale_all_dim")

            def get_mscale(scale: float, m: float = 1.0) -> float:
                return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

            if mscale and mscale_all:
                return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all))
            return get_mscale(factor)
        if self.kind == "longrope":
            if given is not None:
                return float(given)
            factor = self._factor()
            return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(self.original_max or 1))
        return 1.0

    def inv_freq(self, long: bool = False) -> np.ndarray:
        """float32 ``[rotary_dim / 2]``, transformers' float32 arithmetic (``long``: LongRoPE's long factors)."""
        dim = self.rotary_dim
        exps = np.arange(0, dim, 2, dtype=np.int64).astype(_F) / _F(dim)
        # the float32 power correctly rounded (float64, then float32): what torch's CPU pow gives but in rare cases
        pos_freqs = (np.float64(_F(self.theta)) ** exps.astype(np.float64)).astype(_F)
        if self.kind == "longrope":
            ext = np.asarray(self.params["long_factor" if long else "short_factor"], dtype=_F)
            return (_F(1.0) / (ext * pos_freqs)).astype(_F)
        inv = (_F(1.0) / pos_freqs).astype(_F)
        if self.kind == "linear":
            return (inv / _F(self.params["factor"])).astype(_F)
        if self.kind == "llama3":
            return self._llama3(inv)
        if self.kind == "yarn":
            return self._yarn(pos_freqs)
        return inv

    def dynamic_inv_freq(self, length: int) -> np.ndarray:
        """Dynamic NTK (``kind == "dynamic"``): the inverse frequencies transformers uses in a call whose largest
        position + 1 is ``length``: the default ones up to ``max_position_embeddings``, past it the base rescaled
        to ``theta × (factor × length / max - (factor - 1)) ** (d / (d - 2))``, in float32 tensor arithmetic as
        ``dynamic_rope_update`` does it (the length is a tensor there), powers correctly rounded (torch's are
        within an ulp)."""
        dim, max_pos = self.rotary_dim, self.max_position_embeddings
        exps = (np.arange(0, dim, 2, dtype=np.int64).astype(_F) / _F(dim)).astype(np.float64)
        if length <= max_pos:
            return (_F(1.0) / (np.float64(_F(self.theta)) ** exps).astype(_F)).astype(_F)
        factor = float(self.params["factor"])
        scaled = (_F(factor) * _F(length)) / _F(max_pos) - _F(factor - 1)
        power = _F(np.float64(_F(scaled)) ** np.float64(_F(dim / (dim - 2))))
        base = _F(_F(self.theta) * power)
        return (_F(1.0) / (np.float64(base) ** exps).astype(_F)).astype(_F)

    def _llama3(self, inv: np.ndarray) -> np.ndarray:
        p = self.params
        factor, low, high, old = _F(p["factor"]), p["low_freq_factor"], p["high_freq_factor"], p[
            "original_max_position_embeddings"]
        low_wavelen, high_wavelen = _F(old / low), _F(old / high)
        wavelen = (_F(2 * math.pi) / inv).astype(_F)
        scaled = np.where(wavelen > low_wavelen, (inv / factor).astype(_F), inv).astype(_F)
        smooth = ((_F(old) / wavelen - _F(low)) / _F(high - low)).astype(_F)
        smoothed = ((_F(1) - smooth) * scaled / factor + smooth * scaled).astype(_F)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(_F)

    def _yarn(self, pos_freqs: np.ndarray) -> np.ndarray:
        p, dim, base = self.params, self.rotary_dim, self.theta
        factor = self._factor()
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
        original = self.original_max or self.max_position_embeddings

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=_F) - _F(low)) / _F(high - low), 0, 1).astype(_F)
        extrapolation = (_F(1) - ramp).astype(_F)
        inv_extrapolation = (_F(1.0) / pos_freqs).astype(_F)
        inv_interpolation = (_F(1.0) / (_F(factor) * pos_freqs)).astype(_F)
        return (inv_interpolation * (_F(1) - extrapolation) + inv_extrapolation * extrapolation).astype(_F)

    def angles(self, positions: np.ndarray, long: bool = False) -> np.ndarray:
        """float32 ``positions × inv_freq`` (``[..., rotary_dim / 2]``), as transformers' one-term matmul."""
        return (np.asarray(positions, dtype=_F)[..., None] * self.inv_freq(long)).astype(_F)

    def tables(self, rows: int, long: bool = False, layout: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin) float32 ``[rows, rotary_dim]`` for positions ``0..rows-1``, attention scaling included.

        ``layout``: ``"half"`` (``cat(f, f)``), ``"interleaved"`` (``repeat_interleave(f, 2)``) or ``"cache"``
        (``[rows, rotary_dim / 2]``, one column per frequency: GroupQueryAttention's and RotaryEmbedding's caches);
        None: what transformers' rotary module returns (:attr:`table_interleaved`)."""
        layout = layout or ("interleaved" if self.table_interleaved else "half")
        freqs = self.angles(np.arange(rows), long).astype(np.float64)
        emb = {"half": lambda: np.concatenate([freqs, freqs], axis=-1), "cache": lambda: freqs,
               "interleaved": lambda: np.repeat(freqs, 2, axis=-1)}[layout]()
        scale = _F(self.attention_scaling)
        cos, sin = (np.asarray(f(emb), dtype=_F) for f in (np.cos, np.sin))
        if scale != 1:
            cos, sin = (cos * scale).astype(_F), (sin * scale).astype(_F)
        return cos, sin

    def tolerance(self, rows: int, long: bool = False, dtype: Any = np.float32) -> np.ndarray:
        """float64 ``[rows, rotary_dim / 2]``: how far a correct producer's cos/sin cache entry (position ``p``,
        frequency ``j``) may be from :meth:`tables`, from float32 rounding alone: ``INV_FREQ_ULPS`` ulps of the
        inverse frequency times the position, one ulp of the angle, ``VALUE_ULPS`` ulps of the value (× attention
        scaling); a float16 cache adds one float16 ulp of the value."""
        inv = self.inv_freq(long)
        angles = self.angles(np.arange(rows), long)
        scale = abs(float(self.attention_scaling))
        angle_err = np.arange(rows, dtype=np.float64)[:, None] * INV_FREQ_ULPS * np.spacing(inv).astype(np.float64) \
            + np.spacing(np.abs(angles)).astype(np.float64)
        tol = max(scale, 1.0) * (angle_err + VALUE_ULPS * float(np.spacing(_F(1))))
        if np.dtype(dtype) == np.float16:
            cos, _ = self.tables(rows, long, "cache")
            tol = tol + np.spacing(np.maximum(np.abs(cos), 1.0).astype(np.float16)).astype(np.float64)
        return tol

    def first_beyond_rounding(self, role: str, table: np.ndarray, long: bool = False) -> tuple[int | None, float]:
        """(first position, max |difference|) at which ``table`` (a cos or sin table, ``role``) is farther from this
        rope than float32 rounding allows a correct producer (:meth:`tolerance`); (None, worst) when it conforms.
        The width picks the layout: ``rotary_dim / 2`` a cache (one column per frequency), ``rotary_dim``
        transformers' own (:attr:`table_interleaved`); (None, inf) for any other width."""
        rows, width = table.shape
        half = self.rotary_dim // 2
        if width not in (half, 2 * half) or rows == 0:
            return None, float("inf")
        layout = "cache" if width == half else None
        cos, sin = self.tables(rows, long, layout)
        tol = self.tolerance(rows, long, table.dtype)
        if width != half:
            tol = np.repeat(tol, 2, axis=1) if self.table_interleaved else np.concatenate([tol, tol], axis=1)
        diff = np.abs(table.astype(np.float64) - (cos if role == "cos" else sin).astype(np.float64))
        bad = np.flatnonzero((diff > tol).any(axis=1))
        return (int(bad[0]) if bad.size else None), float(diff.max())

    def describe(self) -> str:
        parts = [f"{self.kind} rope, theta {self.theta:g}"]
        if self.kind in ("linear", "llama3", "yarn") and self.params.get("factor") is not None:
            parts.append(f"factor {self.params['factor']:g}")
        if self.original_max:
            parts.append(f"original_max_position_embeddings {self.original_max}")
        if self.partial_rotary_factor != 1:
            parts.append(f"partial_rotary_factor {self.partial_rotary_factor:g} (rotary dim {self.rotary_dim})")
        if self.attention_scaling != 1:
            parts.append(f"attention scaling {self.attention_scaling:.6g}")
        if self.interleaved:
            parts.append("interleaved pairs")
        return (f"{self.layer_type}: " if self.layer_type else "") + ", ".join(parts)


__all__ = ["INV_FREQ_ULPS", "STATIC_TYPES", "VALUE_ULPS", "Rope"]
