"""What the checker reads from the two models before running anything: precision, WebGPU options, LongRoPE switch,
inputs, the rotation tables (:mod:`.tables`), and the helpers that prepare their inputs (embeddings, reference
logits)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.analysis.longrope import LongRoPESwitch
from rope_passes.check.compare import precision_of
from rope_passes.check.decode import embedding_table
from rope_passes.config import GenaiConfig
from rope_passes.errors import UsageError
from rope_passes.io import load_model, resolve_model_path


@dataclasses.dataclass
class ModelInfo:
    path: Path
    genai_config: dict | None
    precision: str
    webgpu_options: dict[str, str]
    longrope: LongRoPESwitch | None
    takes_embeds: bool
    model: Any = dataclasses.field(default=None, repr=False)  # the onnx_ir model (weights read lazily)

    @property
    def context_length(self) -> int | None:
        """genai_config's context length, bounded by the rows of the cos/sin cache the model's GroupQueryAttention
        reads (:func:`.contract.cache_rows`: past them the model refuses the call); None when it states neither."""
        from rope_passes.check.contract import cache_rows

        stated = [n for n in (GenaiConfig(self.genai_config).context_length, cache_rows(self.model)) if n]
        return min(stated) if stated else None

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "precision": self.precision, "webgpu_options": self.webgpu_options,
                "longrope": self.longrope.to_dict() if self.longrope is not None else None}


def capture_on(info: ModelInfo) -> bool:
    """Whether the model's genai_config.json turns WebGPU graph capture on (onnxruntime-genai then creates its
    session with ``enableGraphCapture=1``, and a session that refuses capture fails to load)."""
    options = GenaiConfig(info.genai_config).provider_options("webgpu") if info.genai_config else {}
    return str(options.get("enableGraphCapture", "0")).strip().lower() in ("1", "true")


def read_model(path: str | Path) -> ModelInfo:
    import onnx

    model_path, folder = resolve_model_path(path)
    config = GenaiConfig.load(folder or model_path.parent)
    webgpu = config.provider_options("webgpu")
    # the checker decides capture itself: a plain run under enableGraphCapture=1 silently returns zeros
    webgpu.pop("enableGraphCapture", None)
    model = load_model(model_path)  # one-line errors for a non-ONNX or truncated file, or missing/short external data
    proto = onnx.load(str(model_path), load_external_data=False)
    return ModelInfo(model_path, config.data, precision_of(str(model_path)), webgpu,
                     _longrope(proto, webgpu), any(i.name == "inputs_embeds" for i in proto.graph.input), model)


def load_reference(reference: str | Path | np.ndarray) -> np.ndarray:
    """``[rows, vocab]`` float logits (a leading batch axis of 1 is dropped)."""
    if isinstance(reference, np.ndarray):
        ref = reference
    else:
        try:
            ref = np.load(reference, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{reference}: cannot read reference logits ({type(exc).__name__}: {exc})") from None
    if ref.ndim == 3 and ref.shape[0] == 1:
        ref = ref[0]
    if ref.ndim != 2 or ref.dtype.kind != "f":
        raise UsageError(f"reference logits must be a float [rows, vocab] array, got {ref.dtype} {list(ref.shape)}")
    return ref


def _longrope(proto: Any, webgpu: Mapping[str, str]) -> LongRoPESwitch | None:
    """A LongRoPE cache and its switch point: ``If(Greater(total_len, C))`` picking cos/sin tables (read by the
    LongRoPE detector, :func:`rope_passes.analysis.longrope.find_longrope`), or a concatenated table whose offset is
    in ``multiRotaryCacheConcatOffset`` (the offset onnxruntime will apply, whatever the table)."""
    import onnx_ir as ir

    from rope_passes.analysis.graph import MS_DOMAIN, flag, nodes_of
    from rope_passes.analysis.longrope import find_longrope, separate_qkv

    offset = int(webgpu.get("multiRotaryCacheConcatOffset", "0") or 0)
    if offset > 0:
        # GQAs rotating with a cache but fed separate Q/K/V: onnxruntime ignores the offset there
        ignoring = [g.name or "GroupQueryAttention"
                    for g in nodes_of(ir.serde.deserialize_model(proto), "GroupQueryAttention", MS_DOMAIN)
                    if flag(g, "do_rotary") and len(g.inputs) > 7 and g.inputs[7] is not None and separate_qkv(g)]
        return LongRoPESwitch("concat", offset, tuple(ignoring))

    found = find_longrope(ir.serde.deserialize_model(proto))  # weights stay unread: only the threshold is
    if found is not None and found.kind == "if" and found.threshold is not None:
        return LongRoPESwitch("if", found.threshold)
    return None


def embedding_for(info: ModelInfo, other: ModelInfo, option: str | None, tmp: Path) -> str | None:
    """Embedding table file for an inputs_embeds graph: the user's, else the other graph's own, else None (the
    fixed-seed default table)."""
    if not info.takes_embeds:
        return None
    table = None
    if option:
        table = embedding_table(option)
        if table is None:
            raise UsageError(f"{option}: no Gather(table, input_ids) to take token embeddings from")
    elif not other.takes_embeds:
        table = embedding_table(other.path)
    if table is None:
        return None
    path = tmp / f"embeddings_{abs(hash(str(info.path)))}.npy"
    np.save(path, table)
    return str(path)
