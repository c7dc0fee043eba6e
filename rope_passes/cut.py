"""A decoder cut after its first ``N`` layers, weights read in place: what ``check --layers N`` compares
(real-size models in minutes).

A RoPE rewrite is per layer: every layer rotates its own Q and K with the same tables, so a rewrite that is wrong
anywhere is wrong in layer 0 already. Cutting both graphs after decoder layer ``N`` keeps the check exact for the
kept layers and makes its cost (time, memory, weights read) that of ``N`` layers, not of the whole model: no
``lm_head``, no later layer's weights are ever read.

The cut (:func:`cut_model`), the same on both sides:

* a node's layer is :func:`rope_passes.analysis.layers.layer_in`: its name (builder ``/model/layers.<i>/...``,
  TorchScript ``/m/model/layers.<i>/...``), for torch's dynamo exporter its ``namespace`` metadata
  (``model.layers.<i>: ...``), else its outputs' names (``present.<i>.key``); the builder names
  the final norm ``/model/layers.<L>/final_norm_layernorm``, so ``N`` may go up to ``L`` there;
* the *hidden state* entering layer ``N``: the values that nodes of layer ``>= N`` read from before the cut and that
  depend on layer ``N-1``'s KV cache (the producer of ``present.<N-1>.*``): the residual stream, not the shared
  cos/sin or mask values. The builder passes it as two values (the residual and the MLP output) into layer ``N``'s
  ``SkipSimplifiedLayerNormalization``; their sum (what that node adds) becomes the output ``hidden_states.<N>``.
  Exporters pass one value (the residual ``Add``): it becomes ``hidden_states.<N>`` as is. Any other count gives
  ``hidden_states.<N>.<k>`` in the order layer ``N`` reads them;
* outputs: ``hidden_states.<N>`` and ``present.<i>.*`` for ``i < N``; every node, initializer and input not needed
  for them is dropped (``logits``, the later layers, their ``past_key_values.*``);
* the cut graph (a few MB: no weights) is written *beside* the model, as a hidden file
  ``.<name>.check-layers<N>.<side>.<pid>.onnx`` in the model's own folder, deleted when the check ends: its
  external data references the model's own data files, same locations, same offsets, so no weight byte is copied
  and the folder's ``genai_config.json`` applies. (Elsewhere would not do: onnxruntime and onnx_ir refuse external
  data that resolves outside the model's folder, symbolic links included, and onnx_ir refuses hard-linked data.)
  Only where the folder is not writable is the cut written to a scratch folder with the kept tensors' bytes copied
  (all-zero blocks left as holes; the report says how many MB), ``genai_config.json`` / ``config.json`` beside it.

What is NOT looked at: layers ``>= N`` and ``logits``. A rewrite confined to a later layer (say, a different cos/sin
table for layer 1 only) passes ``--layers 1``; a rewrite that treats layers alike (every pass here) shows in layer 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx

from rope_passes.analysis.layers import layer_in
from rope_passes.errors import UsageError
from rope_passes.io import resolve_model_path

__all__ = ["Cut", "cut_model", "cut_pair", "describe", "hidden_name", "node_layer"]

_PRESENT = re.compile(r"^present\.(\d+)\.")
#: the ops whose first two inputs the builder's residual stream enters as (residual, sublayer output)
_SKIP_NORMS = {"SkipSimplifiedLayerNormalization", "SkipLayerNormalization"}
#: files copied beside the cut graph (the checker reads them)
_SIDE_FILES = ("genai_config.json", "config.json")


def hidden_name(layers: int) -> str:
    return f"hidden_states.{layers}"


@dataclasses.dataclass
class Cut:
    """One graph cut after decoder layer ``layers``: what was kept and where it was written."""

    source: Path  # the original model file
    model: Path  # the cut graph
    layers: int
    total_layers: int  # decoder layers the graph has
    hidden: list[str]  # the hidden-state outputs (usually one: hidden_states.<N>)
    presents: list[str]  # the KV outputs kept
    nodes: tuple[int, int]  # (kept, of all)
    data: dict[str, str]  # external data location -> how the cut reads it (in place / bytes copied)

    def summary(self) -> str:
        return (f"{self.source}: cut after layer {self.layers} of {self.total_layers}: outputs "
                f"{', '.join(self.hidden)} and {len(self.presents)} present.* ({self.nodes[0]} of {self.nodes[1]} "
                f"nodes; weights: {'; '.join(f'{k} {v}' for k, v in sorted(self.data.items())) or 'in the graph'})")

    def remove(self) -> None:
        """Delete the cut graph written beside the model (a scratch folder goes with its temporary directory)."""
        if self.model.parent == self.source.parent:
            self.model.unlink(missing_ok=True)


def node_layer(node: onnx.NodeProto) -> int | None:
    """The decoder layer a node belongs to (:func:`rope_passes.analysis.layers.layer_in`); None for shared nodes."""
    namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), None)
    return layer_in(node.name, namespace, list(node.output))


def _reads(node: onnx.NodeProto) -> list[str]:
    """Every outer value a node reads: its inputs and what its subgraphs take from outside them."""
    names = [v for v in node.input if v]
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            names += _outer_reads(g)
    return names


def _outer_reads(graph: onnx.GraphProto) -> list[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for n in graph.node for o in n.output}
    return [v for n in graph.node for v in _reads(n) if v not in defined]


def _closure(start: Iterable[int], edges: dict[int, set[int]]) -> set[int]:
    seen = set(start)
    todo = list(seen)
    while todo:
        for j in edges.get(todo.pop(), ()):
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return seen


def cut_model(source: str | os.PathLike, layers: int, scratch: str | os.PathLike, tag: str = "cut",
              beside: bool = True) -> Cut:
    """Write ``source`` cut after decoder layer ``layers`` beside it (see the module docstring), or, when its folder
    is not writable or ``beside`` is False, into ``scratch/tag`` with the kept weights copied. ``tag`` names the
    side (``original``, ``rewritten``). :meth:`Cut.remove` deletes a cut written beside the model."""
    if layers < 1:
        raise UsageError("--layers must be >= 1")
    model_path, folder = resolve_model_path(source)
    proto = onnx.load(str(model_path), load_external_data=False)
    g = proto.graph
    nodes = list(g.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    reads = [_reads(n) for n in nodes]
    consumers: dict[int, set[int]] = {}
    for k, names in enumerate(reads):
        for v in names:
            if v in producer:
                consumers.setdefault(producer[v], set()).add(k)

    layer = [node_layer(n) for n in nodes]
    known = [x for x in layer if x is not None]
    if not known:
        raise UsageError(f"{model_path}: no decoder layers found (no node named /model/layers.<i>/... or "
                         "model.layers.<i>): --layers needs them")
    total = max(known) + (0 if any("final_norm" in n.name for n in nodes) else 1)
    after = _closure([k for k, x in enumerate(layer) if x is not None and x >= layers], consumers)
    if not after or layers > total:
        raise UsageError(f"{model_path}: --layers {layers} leaves nothing to cut: the graph has {total} decoder "
                         f"layers (0..{total - 1}); use --layers 1..{max(total - 1, 1)}")

    outputs = {o.name: o for o in g.output}
    presents = [name for name in outputs if (m := _PRESENT.match(name)) and int(m.group(1)) < layers]
    last = [name for name in presents if int(_PRESENT.match(name).group(1)) == layers - 1]  # type: ignore[union-attr]
    if not last:
        raise UsageError(f"{model_path}: no present.{layers - 1}.* output: --layers needs a decoder with a KV cache")
    depends = _closure([producer[name] for name in last if name in producer], consumers)

    boundary: list[str] = []
    for k in sorted(after):
        for v in reads[k]:
            p = producer.get(v)
            if p is not None and p in depends and p not in after and v not in boundary:
                boundary.append(v)
    if not boundary:
        raise UsageError(f"{model_path}: found no hidden state entering layer {layers}")

    elem = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output)}
    dtype = elem.get(last[0], onnx.TensorProto.FLOAT)
    new_nodes: list[onnx.NodeProto] = []
    hidden: list[str] = []
    if len(boundary) == 2 and _skip_norm_reads(boundary, nodes, after, consumers, producer):
        hidden = [hidden_name(layers)]
        new_nodes.append(onnx.helper.make_node("Add", boundary, hidden, name=f"/rope_passes/cut/{hidden[0]}"))
    else:
        hidden = [hidden_name(layers)] if len(boundary) == 1 else [
            f"{hidden_name(layers)}.{k}" for k in range(len(boundary))]
        new_nodes += [onnx.helper.make_node("Identity", [v], [h], name=f"/rope_passes/cut/{h}")
                      for v, h in zip(boundary, hidden)]

    # keep what the new outputs need
    needed = {producer[v] for n in new_nodes for v in n.input} | {producer[p] for p in presents if p in producer}
    keep = set(needed)
    todo = list(needed)
    while todo:
        for v in reads[todo.pop()]:
            p = producer.get(v)
            if p is not None and p not in keep:
                keep.add(p)
                todo.append(p)
    kept = [n for k, n in enumerate(nodes) if k in keep] + new_nodes
    used = {v for n in kept for v in _reads(n)} | set(presents)
    inits = [t for t in g.initializer if t.name in used]
    inputs = [i for i in g.input if i.name in used]
    sources = boundary if len(hidden) == len(boundary) else boundary[:1]  # the Add is typed like its inputs
    out_vis = [onnx.helper.make_tensor_value_info(h, elem.get(v, dtype), None) for h, v in zip(hidden, sources)]
    out_vis += [outputs[p] for p in presents]
    produced = {o for n in kept for o in n.output}
    vis = [vi for vi in g.value_info if vi.name in produced and vi.name not in hidden]

    del g.node[:]
    g.node.extend(kept)
    del g.initializer[:]
    g.initializer.extend(inits)
    del g.input[:]
    g.input.extend(inputs)
    del g.output[:]
    g.output.extend(out_vis)
    del g.value_info[:]
    g.value_info.extend(vis)

    locations = _locations(g.initializer)
    if beside and os.access(model_path.parent, os.W_OK):
        target = model_path.parent / f".{model_path.stem}.check-layers{layers}.{tag}.{os.getpid()}.onnx"
        data = dict.fromkeys(locations, "read in place")
    else:
        out_dir = Path(scratch) / tag
        out_dir.mkdir(parents=True, exist_ok=True)
        data = {}
        for location, tensors in locations.items():
            copied = _copy_ranges(model_path.parent / location, out_dir / location, tensors)
            data[location] = f"kept tensors copied ({copied / 1e6:.0f} MB; the model's folder is not writable)"
        target = out_dir / model_path.name
        for name in _SIDE_FILES:
            side = (folder or model_path.parent) / name
            if side.is_file():
                shutil.copyfile(side, out_dir / name)
    onnx.save(proto, str(target))
    return Cut(model_path, target, layers, total, hidden, presents, (len(kept), len(nodes)), data)


def _skip_norm_reads(pair: list[str], nodes: list[onnx.NodeProto], after: set[int], consumers: dict[int, set[int]],
                     producer: dict[str, int]) -> bool:
    """Whether a skip norm after the cut adds the two values (its inputs 0 and 1, each maybe through Casts: fp16
    builds compute the norm in fp32)."""
    def through_casts(v: str) -> set[str]:
        seen, todo = {v}, [v]
        while todo:
            for k in consumers.get(producer.get(todo.pop(), -1), ()):
                if k in after and nodes[k].op_type == "Cast" and nodes[k].input[0] in seen:
                    for o in nodes[k].output:
                        if o not in seen:
                            seen.add(o)
                            todo.append(o)
        return seen

    a, b = (through_casts(v) for v in pair)
    return any(nodes[k].op_type in _SKIP_NORMS and len(nodes[k].input) >= 2
               and {nodes[k].input[0], nodes[k].input[1]} & a and {nodes[k].input[0], nodes[k].input[1]} & b
               for k in after)


def _locations(tensors: Iterable[onnx.TensorProto]) -> dict[str, list[onnx.TensorProto]]:
    """External data location -> the tensors stored there (a location leaving the folder is refused)."""
    by_location: dict[str, list[onnx.TensorProto]] = {}
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            if Path(location).is_absolute() or ".." in Path(location).parts:
                raise UsageError(f"external data location {location!r} is not a plain relative path")
            by_location.setdefault(location, []).append(t)
    return by_location


def _copy_ranges(src: Path, dst: Path, tensors: list[onnx.TensorProto]) -> int:
    """Copy the byte ranges of ``tensors`` from ``src`` into ``dst`` (all-zero blocks left as holes), 64-byte aligned,
    and point the tensors at their new offsets; returns the bytes the ranges span."""
    total = 0
    pos = 0
    block = 1 << 22
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for t in tensors:
            info = {e.key: e for e in t.external_data}
            offset = int(info["offset"].value) if "offset" in info else 0
            length = int(info["length"].value) if "length" in info else src.stat().st_size - offset
            pos = (pos + 63) // 64 * 64
            fin.seek(offset)
            for start in range(0, length, block):
                chunk = fin.read(min(block, length - start))
                if chunk.count(0) != len(chunk):
                    fout.seek(pos + start)
                    fout.write(chunk)
            if "offset" in info:
                info["offset"].value = str(pos)
            else:
                entry = t.external_data.add()
                entry.key, entry.value = "offset", str(pos)
            pos += length
            total += length
        fout.truncate(pos)
    return total


@contextlib.contextmanager
def cut_pair(original: str | os.PathLike, rewritten: str | os.PathLike, layers: int) -> Iterator[tuple[Cut, Cut]]:
    """Both graphs cut after the same layer, for the ``with`` block; the cuts are deleted after it. Refuses cuts
    whose hidden-state outputs differ (the two graphs would not be compared at the same point)."""
    cuts: list[Cut] = []
    with tempfile.TemporaryDirectory(prefix="rope-check-layers-") as scratch:
        try:
            cuts.append(cut_model(original, layers, scratch, "original"))
            cuts.append(cut_model(rewritten, layers, scratch, "rewritten"))
            a, b = cuts
            if a.hidden != b.hidden:
                raise UsageError(f"--layers {layers}: the two graphs pass layer {layers} different hidden states "
                                 f"({', '.join(a.hidden)} vs {', '.join(b.hidden)}); compare them whole")
            yield a, b
        finally:
            for c in cuts:
                c.remove()


def describe(cuts: tuple[Cut, Cut]) -> list[str]:
    """Report notes for a cut pair."""
    a, b = cuts
    missing = sorted(set(a.presents) ^ set(b.presents))
    notes = [f"--layers {a.layers}: both graphs cut after decoder layer {a.layers} (of {a.total_layers}); compared "
             f"{', '.join(a.hidden)} and present.0..{a.layers - 1}.*; layers >= {a.layers} and logits are NOT "
             "compared", a.summary(), b.summary()]
    if missing:
        notes.append(f"KV outputs only one graph has: {', '.join(missing)}")
    return notes

