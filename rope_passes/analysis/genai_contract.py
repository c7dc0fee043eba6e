"""What a model accepts, read from the model itself (issue 26): the inputs every run of a check draws from.

* **vocabulary** (:func:`stated_vocab`): the rows of the embedding table (the ``Gather`` whose indices are
  ``input_ids``; its shape only, no weight is read), genai_config's ``vocab_size``, the logits' last dimension, the
  ``config.json`` beside the model (a transformers.js folder's, at its top); the smallest wins (an id valid for every
  one of them);
* **context**: genai_config's context length, else the rows of the cos/sin table the graph reads (the table
  comparison's end), and never past the rows of the cos/sin cache its GroupQueryAttention reads
  (:func:`cache_rows`: the op refuses a position past them): no call runs past it;
* **the genai loop** (:class:`GenaiLoop`): ``search.past_present_share_buffer`` (past and present share one
  ``max_length`` buffer), ``search.max_length``, and whether the graph takes a static mask (a ``max_length`` mask of
  ones then zeros: GroupQueryAttention's total length is the mask's sum, not its width, as the builder's ``_graph``
  models compute it: :func:`total_is_mask_sum`);
* **what the client reads of its config** (:func:`config_mismatches`): the past/present name patterns genai binds
  the KV cache by, and the head counts it sizes the buffers with, must describe the graph's GroupQueryAttention
  (its past_key/past_value inputs, present outputs, ``kv_num_heads``/``num_heads``);
* **positions from the caller**: a graph with a ``position_ids`` input and no GroupQueryAttention (an exporter,
  optimum or transformers.js layout) rotates by the positions it is given, which run ahead of its cache when the
  caller keeps fewer rows than positions.

Every genai_config.json fact is read through :class:`rope_passes.config.GenaiConfig`. The one fact that needs a graph
evaluated (whether GroupQueryAttention's total length is the mask's sum) takes the evaluator as an argument: analysis
opens no session (the checker passes :func:`rope_passes.runtime.evaluate.evaluate_subgraph`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rope_passes.config import GenaiConfig
from rope_passes.graph_walk import nodes as walk
from rope_passes.io.layout import model_root

#: runs a subgraph: ``evaluate(model, inputs, outputs, feeds) -> arrays`` (:func:`rope_passes.runtime.evaluate.
#: evaluate_subgraph`)
RunSubgraph = Callable[[Any, list, list, list], list]


def _nodes(model: Any) -> Iterable[Any]:
    return walk(model.graph) if model is not None else ()


def embedding_rows(model: Any) -> int | None:
    """The rows of the table a ``Gather`` looks ``input_ids`` up in (its declared shape), or None."""
    for node in _nodes(model):
        if node.op_type != "Gather" or len(node.inputs) < 2 or node.inputs[1] is None or node.inputs[0] is None:
            continue
        if node.inputs[1].name != "input_ids":
            continue
        axis = node.attributes.get("axis")
        if axis is not None and int(axis.as_int()) != 0:
            continue
        shape = node.inputs[0].shape
        if shape is not None and len(shape) >= 1 and isinstance(shape[0], int) and shape[0] > 0:
            return int(shape[0])
    return None


def cache_rows(model: Any) -> int | None:
    """The fewest rows of a cos/sin cache a GroupQueryAttention reads (inputs 7 and 8, declared shapes), or None:
    onnxruntime refuses a call whose positions reach past them ("cos_cache dimension 0 shall not be less than ..."),
    so the model accepts no longer context, whatever its genai_config says."""
    rows = []
    for node in _nodes(model):
        if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
            continue
        for value in node.inputs[7:9]:
            shape = value.shape if value is not None else None
            if shape is not None and len(shape) >= 1 and isinstance(shape[0], int) and shape[0] > 0:
                rows.append(int(shape[0]))
    return min(rows) if rows else None


def _gqa_nodes(model: Any) -> list[Any]:
    return [n for n in _nodes(model) if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]


def _same_value(value: Any, side: str) -> list[Any]:
    """``value`` and the values an ``Identity`` chain makes of it: towards the graph's outputs (``side``
    "outputs") or back towards its inputs ("inputs"). The same tensor by value: onnxruntime-genai binds the name,
    whatever node writes it (measured: the builder's llama with an Identity before ``present.0.key`` decodes two
    conversations on genai 0.18's shared buffers within 3.5e-6 of the original)."""
    out, todo = [value], [value]
    while todo:
        v = todo.pop()
        if side == "outputs":
            nxt = [n.outputs[0] for n in v.consumers() if n.op_type == "Identity" and n.domain in ("", "ai.onnx")]
        else:
            p = v.producer()
            nxt = [p.inputs[0]] if p is not None and p.op_type == "Identity" and p.domain in ("", "ai.onnx") \
                and p.inputs[0] is not None else []
        for n in nxt:
            if all(n is not seen for seen in out):
                out.append(n)
                todo.append(n)
    return out


def config_mismatches(model: Any, cfg: GenaiConfig) -> list[str]:
    """Where a genai folder's ``genai_config.json`` does not describe its graph the way onnxruntime-genai reads it:
    the ``past_key_names``/``past_value_names`` (``present_*``) patterns must name, for each layer, graph inputs
    (outputs) that a GroupQueryAttention reads as past_key/past_value (writes as present_key/present_value), in that
    role, directly or through ``Identity`` (:func:`_same_value`); ``num_key_value_heads``/``num_attention_heads``
    must be its ``kv_num_heads``/``num_heads``. Empty when the model has no config or no GroupQueryAttention (nothing
    to bind)."""
    if not cfg or model is None:
        return []
    gqas = _gqa_nodes(model)
    if not gqas:
        return []
    out: list[str] = []
    layers = cfg.decoder_int("num_hidden_layers") or len(gqas)
    slots = {"past_key_names": ("inputs", 3), "past_value_names": ("inputs", 4),
             "present_key_names": ("outputs", 1), "present_value_names": ("outputs", 2)}
    role: dict[str, str] = {}  # value name -> the slot a GroupQueryAttention reads or writes it in
    for node in gqas:
        for key, (side, index) in slots.items():
            values = node.inputs if side == "inputs" else node.outputs
            if len(values) > index and values[index] is not None:
                for value in _same_value(values[index], side):
                    if value.name:
                        role[value.name] = key
    for key, (side, _) in slots.items():
        pattern = (cfg.decoder_inputs if side == "inputs" else cfg.decoder_outputs).get(key)
        if not pattern or "%d" not in pattern:
            continue
        for layer in range(layers):
            name = pattern.replace("%d", str(layer))
            if role.get(name) != key:
                what = (f"GroupQueryAttention's {role[name].removesuffix('_names')}" if name in role else
                        f"no {'past input' if side == 'inputs' else 'present output'} of a GroupQueryAttention")
                out.append(f"{key} {pattern!r} names {name!r}, which is {what}")
                break
    for key, attr in (("num_key_value_heads", "kv_num_heads"), ("num_attention_heads", "num_heads")):
        stated = cfg.decoder_int(key)
        have = {int(a.as_int()) for n in gqas if (a := n.attributes.get(attr)) is not None}
        if stated is not None and have and stated not in have:
            out.append(f"{key} is {stated}, the graph's GroupQueryAttention {attr} {sorted(have)}")
    return out


def _hf_vocab(path: Path) -> int | None:
    cfg = model_root(path) / "config.json"  # a transformers.js folder's model is in onnx/, its config at the top
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    for section in (data, data.get("text_config") or {} if isinstance(data, dict) else {}):
        value = section.get("vocab_size") if isinstance(section, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def stated_vocab(model: Any, cfg: GenaiConfig, path: str | Path) -> list[int]:
    """Every vocabulary size the model at ``path`` states (module docstring); empty when it states none."""
    out = [cfg.vocab_size] if cfg.vocab_size is not None else []
    rows = embedding_rows(model)
    if rows is not None:
        out.append(rows)
    if model is not None:
        for v in model.graph.outputs:
            shape = v.shape
            if v.name == "logits" and shape is not None and len(shape) and isinstance(shape[-1], int):
                out.append(int(shape[-1]))
    hf = _hf_vocab(Path(path))
    if hf is not None:
        out.append(hf)
    return out


def total_is_mask_sum(model: Any, evaluate: RunSubgraph, mask_name: str = "attention_mask") -> bool:
    """Whether GroupQueryAttention's total length (input 6) is the mask's largest row sum, evaluated on a mask of
    ones then zeros (``[[1, 1, 0]]``: the sum 2, the width 3) on onnxruntime's CPU: the builder's ``_graph`` models
    (``ReduceMax(ReduceSum(mask))``) take the capture loop's ``max_length`` mask in a plain run; a graph whose total is
    the mask's width (``Shape``, or ``total-seq-on-gpu``'s GPU form, right under capture only) does not."""
    import numpy as np

    mask = next((v for v in model.graph.inputs if v.name == mask_name), None) if model is not None else None
    gqa = next((n for n in _nodes(model) if n.op_type == "GroupQueryAttention" and len(n.inputs) > 6
                and n.inputs[6] is not None), None)
    if mask is None or gqa is None or mask.dtype is None:
        return False
    try:
        (total,) = evaluate(model, [mask], [gqa.inputs[6]],
                                     [np.array([[1, 1, 0]], mask.dtype.numpy())])
    except Exception:  # noqa: BLE001 - a total that reads more than the mask: not the capture loop's form
        return False
    return int(np.asarray(total).reshape(-1)[0]) == 2


@dataclasses.dataclass(frozen=True)
class GenaiLoop:
    """How onnxruntime-genai calls one graph (module docstring)."""

    share_buffer: bool = False  # past/present of max_length, one buffer
    max_length: int | None = None
    static_mask: bool = False  # the graph takes a max_length mask of ones then zeros (its total from the mask sum)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def genai_loop(model: Any, cfg: GenaiConfig, evaluate: RunSubgraph) -> GenaiLoop:
    """The genai loop of a model and its config (none: the default, plain calls); ``evaluate`` runs the mask-sum probe
    (:func:`total_is_mask_sum`) for a shared-buffer config only."""
    if not cfg:
        return GenaiLoop()
    max_length = cfg.max_length or cfg.context_length
    context = cfg.context_length
    if context is not None and max_length is not None:
        max_length = min(max_length, context)
    share = cfg.share_buffer and max_length is not None
    mask = cfg.decoder_inputs.get("attention_mask", "attention_mask")
    return GenaiLoop(share_buffer=share, max_length=max_length,
                     static_mask=share and total_is_mask_sum(model, evaluate, mask))


def caller_positions(model: Any) -> bool:
    """Whether the graph rotates by the ``position_ids`` its caller sends (an exporter layout: a ``position_ids``
    input and no GroupQueryAttention, whose fused rotation on WebGPU derives positions from the cache)."""
    if model is None or not any(v.name == "position_ids" for v in model.graph.inputs):
        return False
    return not any(n.op_type == "GroupQueryAttention" for n in _nodes(model))


__all__ = ["RunSubgraph", "GenaiLoop", "cache_rows", "caller_positions", "config_mismatches", "embedding_rows",
           "genai_loop", "stated_vocab", "total_is_mask_sum"]
