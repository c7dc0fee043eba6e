"""What the checker reads from the two models before running anything, each read once through
:func:`rope_passes.io.load_bundle` (:class:`ModelInfo`; the facts themselves come from :mod:`rope_passes.analysis`),
and the helpers that prepare their inputs (embeddings, reference logits). The raw genai_config dict travels only to
a run's subprocess (:class:`.spec.RunSpec`)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.analysis.attention import attention_layout as layout_of
from rope_passes.analysis.genai_contract import GenaiLoop, cache_rows, genai_loop, stated_vocab
from rope_passes.analysis.graph import precision_of
from rope_passes.analysis.longrope import LongRoPESwitch
from rope_passes.analysis.rotation_tables import Evaluators, GraphTables, graph_tables
from rope_passes.check.decode import embedding_table
from rope_passes.config import GRAPH_CAPTURE_OPTION, GenaiConfig
from rope_passes.errors import UsageError
from rope_passes.io import load_bundle


@dataclasses.dataclass
class ModelInfo:
    path: Path
    genai_config: GenaiConfig
    precision: str
    webgpu_options: dict[str, str]
    longrope: LongRoPESwitch | None
    takes_embeds: bool
    model: Any = dataclasses.field(default=None, repr=False)  # the onnx_ir model (weights read lazily)

    def __post_init__(self) -> None:
        if not isinstance(self.genai_config, GenaiConfig):
            self.genai_config = GenaiConfig(self.genai_config)

    @property
    def context_length(self) -> int | None:
        """genai_config's context length, bounded by the rows of the cos/sin cache the model's GroupQueryAttention
        reads (:func:`rope_passes.analysis.genai_contract.cache_rows`: past them the model refuses the call); None
        when it states neither."""
        stated = [n for n in (self.genai_config.context_length, cache_rows(self.model)) if n]
        return min(stated) if stated else None

    @functools.cached_property
    def loop(self) -> GenaiLoop:
        """How onnxruntime-genai calls this graph (:func:`rope_passes.analysis.genai_contract.genai_loop`), read
        once."""
        from rope_passes.runtime.evaluate import evaluate_subgraph

        return genai_loop(self.model, self.genai_config, evaluate_subgraph)

    @functools.cached_property
    def vocab(self) -> list[int]:
        """Every vocabulary size the model states (:func:`rope_passes.analysis.genai_contract.stated_vocab`)."""
        return stated_vocab(self.model, self.genai_config, self.path)

    @property
    def capture_on(self) -> bool:
        """Whether the model's genai_config.json turns WebGPU graph capture on (:attr:`GenaiConfig.graph_capture`)."""
        return self.genai_config.graph_capture is True

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "precision": self.precision, "webgpu_options": self.webgpu_options,
                "longrope": self.longrope.to_dict() if self.longrope is not None else None}


def rotation_tables_of(info: ModelInfo, ep: str) -> GraphTables:
    """The rows each rotation of ``info``'s graph reads (:func:`rope_passes.analysis.rotation_tables.graph_tables`,
    its constants by :func:`rope_passes.proofs.constants.table`, its cones on onnxruntime CPU); a graph the reader
    trips on is reported, not a crash of the checker."""
    from rope_passes.proofs.constants import table
    from rope_passes.runtime.evaluate import evaluate_subgraph

    try:
        return graph_tables(info.model, info.genai_config, Evaluators(table, evaluate_subgraph), ep=ep)
    except Exception as exc:  # noqa: BLE001
        return GraphTables(unavailable=f"reading its rotations failed ({type(exc).__name__}: "
                                       f"{' '.join(str(exc).split())[:200]})")


def read_model(path: str | Path) -> ModelInfo:
    bundle = load_bundle(path)  # one-line errors for a non-ONNX or truncated file, or missing/short external data
    config = bundle.genai_config
    webgpu = config.provider_options("webgpu")
    # the checker decides capture itself: a plain run under enableGraphCapture=1 silently returns zeros
    webgpu.pop(GRAPH_CAPTURE_OPTION, None)
    model = bundle.model
    return ModelInfo(bundle.model_path, config, precision_of(model), webgpu, _longrope(model, webgpu),
                     any(i.name == "inputs_embeds" for i in model.graph.inputs), model)


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


def _longrope(model: Any, webgpu: dict[str, str]) -> LongRoPESwitch | None:
    """A LongRoPE cache and its switch point: ``If(Greater(total_len, C))`` (or a ``Where`` on it) picking cos/sin
    tables (read by the LongRoPE detector, :func:`rope_passes.analysis.longrope.find_longrope`), or a concatenated
    table whose offset is in ``multiRotaryCacheConcatOffset`` (the offset onnxruntime will apply, whatever the
    table)."""
    from rope_passes.analysis.graph import MS_DOMAIN, flag, nodes_of
    from rope_passes.analysis.longrope import find_longrope, separate_qkv

    offset = int(webgpu.get("multiRotaryCacheConcatOffset", "0") or 0)
    if offset > 0:
        # GQAs rotating with a cache but fed separate Q/K/V: onnxruntime ignores the offset there
        ignoring = [g.name or "GroupQueryAttention" for g in nodes_of(model, "GroupQueryAttention", MS_DOMAIN)
                    if flag(g, "do_rotary") and len(g.inputs) > 7 and g.inputs[7] is not None and separate_qkv(g)]
        return LongRoPESwitch("concat", offset, tuple(ignoring))

    found = find_longrope(model)  # weights stay unread: only the threshold is
    # an If, or a Where of two whole tables (then_tables: the If without control flow; not the inv_freq Where)
    if found is not None and found.threshold is not None and (found.kind == "if" or found.then_tables):
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


def attention_layout(info: Any) -> list[tuple] | None:
    """:func:`rope_passes.analysis.attention.attention_layout` of ``info``'s model (None: not at hand)."""
    return None if getattr(info, "model", None) is None else layout_of(info.model)
