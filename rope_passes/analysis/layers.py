"""Which attention layer a node belongs to, read from the names exporters and builders give (one home: lint's
rotation and conformance rules, the rotation probe).

* ``/model/layers.3/attn/...``, ``transformer.h.3...``, ``blocks_3``: :data:`LAYER`;
* a KV-cache graph output that names its layer (``present.3.key``, ``present_key_values.3...``,
  ``key_values_3``): :data:`PRESENT`.
"""

from __future__ import annotations

import re

import onnx_ir as ir

#: a layer number in a node or value name
LAYER = re.compile(r"(?:^|[./_])(?:layers|h|blocks?)[./_](\d+)(?:[./_]|$)")
#: a KV-cache output's layer number
PRESENT = re.compile(r"(?:present|key_values)[._](?:key_values[._]|layers[._])?(\d+)[._]")


def layer_in_name(name: str | None) -> int | None:
    """The layer number a node or value name spells (:data:`LAYER`), or None."""
    found = LAYER.search(name or "")
    return int(found.group(1)) if found else None


def present_layer(name: str | None) -> int | None:
    """The layer of a KV-cache output name (:data:`PRESENT`), or None."""
    found = PRESENT.search(name or "")
    return int(found.group(1)) if found else None


def layer_of(node: ir.Node, default: int) -> int:
    """The layer ``node`` belongs to: its name, else one of its outputs' (a ``present.N`` output or a layer name),
    else ``default`` (its position among its kind)."""
    for name in (node.name or "", *(o.name or "" for o in node.outputs)):
        found = present_layer(name)
        found = found if found is not None else layer_in_name(name)
        if found is not None:
            return found
    return default


__all__ = ["LAYER", "PRESENT", "layer_in_name", "layer_of", "present_layer"]
