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

What a rope computes (its inverse frequencies, tables and tolerances) is :class:`rope_passes.rope.Rope`'s; this
module reads the config and builds the ropes it declares (:meth:`HFConfig.rope`, :meth:`HFConfig.layer_rope`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rope_passes.errors import ModelLoadError
from rope_passes.errors import show_value as _show
from rope_passes.report import MatchFailure
from rope_passes.rope import INV_FREQ_ULPS, STATIC_TYPES, VALUE_ULPS, Rope

#: file names exporters write the model's config under, in the order they are looked for
CONFIG_NAMES = ("config.json", "model_config.json")
#: model types whose transformers code rotates interleaved pairs (2i, 2i+1) (rotate_every_two, or rotate_half on
#: x[..., 0::2] / x[..., 1::2]); every other family rotates halves (i, i + d/2)
INTERLEAVED_TYPES = frozenset({"cohere", "cohere2", "cohere2_moe", "ernie4_5", "ernie4_5_moe", "gptj", "codegen",
                               "glm", "glm4", "helium"})
#: of those, the families whose rotary module returns cos/sin already repeated per pair (repeat_interleave, not cat)
TABLE_INTERLEAVED_TYPES = frozenset({"cohere", "cohere2", "cohere2_moe"})
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
