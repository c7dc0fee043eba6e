"""The Hugging Face ``config.json`` beside an exported model, and the RoPE tables it says the model computes.

Exporters (optimum, transformers' own, ``save_pretrained`` next to a ``torch.onnx.export``) leave the model's
``config.json`` beside the graph. It holds what the graph alone cannot say: the table size
(``max_position_embeddings``), the rope type and its scaling (linear, llama3, yarn, LongRoPE short/long factors with
``original_max_position_embeddings``, attention scaling) and the partial rotary factor. Both layouts are read:
transformers 4 (``rope_theta``, ``rope_scaling``, top-level ``partial_rotary_factor`` /
``original_max_position_embeddings``, Gemma3's ``rope_local_base_freq``) and transformers 5 (``rope_parameters``,
flat or per layer type). Olive's ``model_config.json`` is read through its ``config.model_attributes`` (the HF
config Olive copied there).

    config = HFConfig.find("model_dir")           # config.json / model_config.json beside it, or None
    rope = config.rope()                          # Rope; MatchFailure.refuse for dynamic NTK
    cos, sin = rope.tables(256)                   # float32 [256, rotary_dim]

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
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.errors import ModelLoadError
from rope_passes.errors import show_value as _show
from rope_passes.report import MatchFailure

#: file names exporters write the model's config under, in the order they are looked for
CONFIG_NAMES = ("config.json", "model_config.json")
#: rope types with one fixed table (LongRoPE: two, switched by the call's largest position)
STATIC_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
#: model types whose transformers code rotates interleaved pairs (2i, 2i+1) (rotate_every_two, or rotate_half on
#: x[..., 0::2] / x[..., 1::2]); every other family rotates halves (i, i + d/2)
INTERLEAVED_TYPES = frozenset({"cohere", "cohere2", "cohere2_moe", "ernie4_5", "ernie4_5_moe", "gptj", "codegen",
                               "glm", "glm4", "helium"})
#: of those, the families whose rotary module returns cos/sin already repeated per pair (repeat_interleave, not cat)
TABLE_INTERLEAVED_TYPES = frozenset({"cohere", "cohere2", "cohere2_moe"})
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


#: rope parameters that must be real numbers where a config sets them (None: unset)
NUMERIC_PARAMS = ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                  "low_freq_factor", "high_freq_factor")
#: rope parameters that must be positive integers where a config sets them
POSITIVE_INT_PARAMS = ("original_max_position_embeddings",)
#: the largest position count rope-passes takes from a config (a cos/sin table's rows: onnxruntime's int32 sizes)
MAX_POSITIONS = 2**31 - 1


def _number(where: str, key: str, value: Any) -> float:
    """``value`` as a float when it is a real finite number (bool is not one); ModelLoadError naming ``key`` else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ModelLoadError(f"{where}: {key} {_show(value)} is not a finite number")
    return float(value)


def _check_numbers(where: str, params: Mapping[str, Any], theta_key: str = "rope_theta") -> None:
    """ModelLoadError (one line, naming the key) for a rope parameter of the wrong type, before any arithmetic."""
    if params.get("rope_theta") is not None:
        _number(where, theta_key, params["rope_theta"])
    for key in NUMERIC_PARAMS:
        if params.get(key) is not None:
            _number(where, key, params[key])
    for key in POSITIVE_INT_PARAMS:
        value = params.get(key)
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value) or not 0 < value <= MAX_POSITIONS):
            raise ModelLoadError(f"{where}: {key} {_show(value)} is not a positive integer (at most {MAX_POSITIONS})")


def _olive_attributes(data: dict[str, Any]) -> dict[str, Any]:
    """Olive's ``model_config.json`` (``{"type": "onnxmodel", "config": {"model_attributes": {...}}}``, written
    beside the graph by ``olive capture-onnx-graph``) holds the Hugging Face config as ``model_attributes``."""
    inner = data.get("config")
    if "model_type" not in data and isinstance(inner, dict) and isinstance(inner.get("model_attributes"), dict):
        return inner["model_attributes"]
    return data


@dataclasses.dataclass(frozen=True)
class HFConfig:
    """A parsed Hugging Face model config (``config.json``)."""

    path: Path
    data: Mapping[str, Any]

    @classmethod
    def load(cls, path: str | os.PathLike) -> HFConfig:
        """Read ``path`` (a config.json, or a folder holding one); ModelLoadError when it cannot be read."""
        p = Path(path)
        if p.is_dir():
            found = next((p / n for n in CONFIG_NAMES if (p / n).is_file()), None)
            if found is None:
                raise ModelLoadError(f"{p}: no {' or '.join(CONFIG_NAMES)} in this folder")
            p = found
        try:
            data = json.loads(p.read_text())
        except OSError as exc:
            raise ModelLoadError(f"{p}: cannot read the Hugging Face config ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise ModelLoadError(f"{p}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"{p}: not a Hugging Face config (the top level is not an object)")
        return cls(p, _olive_attributes(data))

    @classmethod
    def find(cls, model_path: str | os.PathLike | None, explicit: str | os.PathLike | None = None) -> HFConfig | None:
        """``explicit`` (``--hf-config``: the run plan's :attr:`~rope_passes.plan.RunPlan.hf_config`) if given, else
        the config beside ``model_path`` (for a model in a transformers.js folder's ``onnx/``: the folder's,
        :func:`rope_passes.io.layout.model_root`)."""
        from rope_passes.io.layout import model_root

        if explicit is not None:
            return cls.load(explicit)
        if model_path is None:
            return None
        folder = Path(model_path)
        folder = folder if folder.is_dir() else model_root(folder)
        for name in CONFIG_NAMES:
            candidate = folder / name
            if candidate.is_file():
                loaded = cls.load(candidate)
                if "model_type" in loaded.data or "max_position_embeddings" in loaded.data:
                    return loaded
        return None

    # -- facts ------------------------------------------------------------------------------------------------
    def _get(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None and isinstance(self.data.get("text_config"), dict):
            value = self.data["text_config"].get(key)
        return value

    def _first(self, *keys: str) -> Any:
        """The first of ``keys`` the config sets (GPT-J/GPT-2 names after the usual ones)."""
        return next((v for v in (self._get(k) for k in keys) if v is not None), None)

    @property
    def model_type(self) -> str:
        return str(self.data.get("model_type") or "")

    @property
    def max_position_embeddings(self) -> int | None:
        value = self._first("max_position_embeddings", "n_positions")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @property
    def head_dim(self) -> int | None:
        value = self._get("head_dim")
        if isinstance(value, int) and value > 0:
            return value
        hidden, heads = self._first("hidden_size", "n_embd"), self._first("num_attention_heads", "n_head")
        return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None

    @property
    def num_layers(self) -> int | None:
        value = self._first("num_hidden_layers", "n_layer")
        return int(value) if isinstance(value, int) and value > 0 else None

    def layer_type_of(self, layer: int) -> str | None:
        """Layer ``layer``'s type where types have their own rope (Gemma 3), else None."""
        types = self.layer_types()
        if types == [None]:
            return None
        listed = self._get("layer_types")
        if isinstance(listed, list) and layer < len(listed) and listed[layer] in types:
            return str(listed[layer])
        pattern = self._first("sliding_window_pattern", "_sliding_window_pattern")
        if isinstance(pattern, int) and pattern > 0:  # transformers 4 Gemma 3: every pattern-th layer is global
            return "full_attention" if (layer + 1) % pattern == 0 else "sliding_attention"
        return None

    def uses_rope(self, layer: int) -> bool:
        """False for a layer transformers runs without RoPE (SmolLM3's ``no_rope_layers[i] == 0``)."""
        flags = self._get("no_rope_layers")
        if isinstance(flags, list) and layer < len(flags):
            return bool(flags[layer])
        return True

    def layer_rope(self, layer: int) -> Rope | None:
        """What layer ``layer`` rotates by (None: no RoPE); MatchFailure.refuse as :meth:`rope`."""
        if not self.uses_rope(layer):
            return None
        return self.rope(self.layer_type_of(layer))

    def layer_types(self) -> list[str | None]:
        """Layer types with their own rope (transformers 5 per-layer ``rope_parameters``, Gemma3), else [None]."""
        params = self._get("rope_parameters")
        if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
            return sorted(params)
        if self._get("rope_local_base_freq") is not None:
            return ["full_attention", "sliding_attention"]
        return [None]

    def rope(self, layer_type: str | None = None, dynamic: bool = False) -> Rope:
        """The rope of ``layer_type`` (None: the only one); MatchFailure.refuse for dynamic (unless ``dynamic``:
        then a ``kind == "dynamic"`` Rope, whose frequencies depend on the call, :meth:`Rope.dynamic_inv_freq`) or
        unknown types."""
        params = self._rope_params(layer_type)
        kind = str(params.get("rope_type") or params.get("type") or "default")
        if kind == "mrope":
            kind = "default"  # transformers 4 Qwen2.5-VL: default frequencies, split by sections afterwards
        where = f"{self.path}" + (f" ({layer_type})" if layer_type else "")
        if kind == "dynamic" and dynamic:
            pass
        elif "dynamic" in kind:
            raise MatchFailure.refuse(
                f"{where}: rope_type {kind!r} (dynamic NTK) rescales the frequencies from the call's largest position "
                "(no single table is right for every call)", "<model>", rope_type=kind)
        if kind not in STATIC_TYPES and not (kind == "dynamic" and dynamic):
            raise MatchFailure.refuse(f"{where}: rope_type {kind!r} is not one rope-passes computes "
                                      f"({', '.join(STATIC_TYPES)})", "<model>", rope_type=kind)
        theta = params.get("rope_theta")
        theta_key = "rope_theta"
        if (layer_type == "sliding_attention" and not isinstance(self._get("rope_parameters"), dict)
                and self._get("rope_local_base_freq") is not None):
            theta_key = "rope_local_base_freq"
        _check_numbers(where, params, theta_key)
        raw_max = self._first("max_position_embeddings", "n_positions")
        if isinstance(raw_max, bool) or (isinstance(raw_max, int) and not 0 < raw_max <= MAX_POSITIONS):
            raise ModelLoadError(f"{where}: max_position_embeddings {_show(raw_max)} is not a positive integer "
                                 f"(at most {MAX_POSITIONS})")
        head_dim, max_pos = self.head_dim, self.max_position_embeddings
        if theta is None or head_dim is None or max_pos is None:
            raise MatchFailure.refuse(f"{where}: rope_theta, head_dim (or hidden_size/num_attention_heads) and "
                                      "max_position_embeddings are needed", "<model>")
        partial = params.get("partial_rotary_factor", self._first("partial_rotary_factor", "rotary_pct"))
        if partial is not None and not 0 < _number(where, "partial_rotary_factor", partial) <= 1:
            raise ModelLoadError(f"{where}: partial_rotary_factor {_show(partial)} is not in (0, 1] (the rotated "
                                 "fraction of head_dim)")
        rotary_dim = self._get("rotary_dim")  # GPT-J / CodeGen: the rotated width itself
        if partial is None and isinstance(rotary_dim, int) and 0 < rotary_dim <= head_dim:
            partial = rotary_dim / head_dim
        if kind == "yarn" and self.layer_types() != [None]:  # transformers reads truncate from the top-level
            params = {**params, "truncate": True}  # rope_parameters only: per layer type, always True
        interleaved = self.model_type in INTERLEAVED_TYPES
        return Rope(kind, float(theta), head_dim, float(partial if partial is not None else 1.0), max_pos,
                    dict(params), layer_type, interleaved, self.model_type in TABLE_INTERLEAVED_TYPES)

    def _rope_params(self, layer_type: str | None) -> dict[str, Any]:
        params = self._get("rope_parameters")
        if isinstance(params, dict) and params:
            if layer_type is not None and isinstance(params.get(layer_type), dict):
                params = params[layer_type]
            out = dict(params)
        else:  # transformers 4: rope_theta + rope_scaling (+ Gemma3's local base for sliding layers)
            scaling = self._get("rope_scaling")
            out = dict(scaling) if isinstance(scaling, dict) else {}
            out["rope_theta"] = self._get("rope_theta") if self._get("rope_theta") is not None else 10000.0
            if layer_type == "sliding_attention" and self._get("rope_local_base_freq") is not None:
                out = {"rope_type": "default", "rope_theta": self._get("rope_local_base_freq")}
        if "original_max_position_embeddings" not in out and self._get("original_max_position_embeddings"):
            out["original_max_position_embeddings"] = self._get("original_max_position_embeddings")
        return out


__all__ = ["CONFIG_NAMES", "INTERLEAVED_TYPES", "INV_FREQ_ULPS", "STATIC_TYPES", "TABLE_INTERLEAVED_TYPES",
           "VALUE_ULPS", "HFConfig", "Rope"]
