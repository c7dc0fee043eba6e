"""Which attention layer a node belongs to, read from the names exporters and builders give (one home: lint's
rotation and conformance rules, the rotation probe).

* ``/model/layers.3/attn/...``, ``transformer.h.3...``, ``blocks_3``: :data:`LAYER`;
* a KV-cache graph output that names its layer (``present.3.key``, ``present_key_values.3...``,
  ``key_values_3``): :data:`PRESENT`;
* torch's dynamo exporter, whose node names carry no layer: the node's ``namespace`` metadata
  (``model.layers.3: LlamaDecoderLayer/...``): :data:`NAMESPACE`.

``check --layers`` cuts a graph with the same rule (:func:`layer_in`, on a node's name, namespace and outputs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import onnx_ir as ir

#: a layer number in a node or value name
LAYER = re.compile(r"(?:^|[./_])(?:layers|h|blocks?)[./_](\d+)(?:[./_]|$)")
#: a KV-cache output's layer number
PRESENT = re.compile(r"(?:present|key_values)[._](?:key_values[._]|layers[._])?(\d+)[._]")
#: a layer number in a dynamo ``namespace`` metadata entry (``model.layers.3: LlamaDecoderLayer``)
NAMESPACE = re.compile(r"(?:^|[\s/:.])layers\.(\d+)(?:[:./]|$)")


def layer_in_name(name: str | None) -> int | None:
    """The layer number a node or value name spells (:data:`LAYER`), or None."""
    found = LAYER.search(name or "")
    return int(found.group(1)) if found else None


def present_layer(name: str | None) -> int | None:
    """The layer of a KV-cache output name (:data:`PRESENT`), or None."""
    found = PRESENT.search(name or "")
    return int(found.group(1)) if found else None


def layer_in(name: str | None, namespace: str | None, outputs: Sequence[str | None] = ()) -> int | None:
    """The layer a node belongs to from its name, else its ``namespace`` metadata (:data:`NAMESPACE`), else one of
    its outputs' names (a ``present.N`` output or a layer name); None for a shared node."""
    def spelled(text: str | None) -> int | None:
        found = present_layer(text)
        return found if found is not None else layer_in_name(text)

    found = spelled(name)
    if found is None and namespace:
        match = NAMESPACE.search(namespace)
        found = int(match.group(1)) if match else None
    for out in outputs if found is None else ():
        found = spelled(out)
        if found is not None:
            break
    return found


def layer_of(node: ir.Node, default: int) -> int:
    """The layer ``node`` belongs to (:func:`layer_in`), else ``default`` (its position among its kind)."""
    found = layer_in(node.name, node.metadata_props.get("namespace"), [o.name for o in node.outputs])
    return found if found is not None else default


__all__ = ["LAYER", "NAMESPACE", "PRESENT", "layer_in", "layer_in_name", "layer_of", "present_layer"]
