"""What a JavaScript client reads from a graph's inputs: transformers.js sizes the empty past from dim names.

transformers.js 4.3 (``addPastKeyValues`` in ``src/models/modeling_utils``) makes the first call's empty cache from
each cache input's metadata shape: a number stays, the symbols ``batch_size`` and ``batch_size x num_heads`` become
the call's batch (times the heads), **every other symbol becomes 0**. That is right for the past length and wrong for
the batch axis: a graph whose cache inputs name their batch axis otherwise (``batch``: torch's dynamo exporter with
``dynamic_shapes={"batch": ...}``) gets ``[0, kv_heads, 0, head_dim]`` pasts and fails at its first Reshape
(``requested shape:{0,7,-1,16}``). One home for that fact: the lint rule (RP501) and the pass that renames the symbol
(``name-batch-dim``) both read :func:`batch_symbols`.
"""

from __future__ import annotations

import onnx_ir as ir

import rope_passes.graph_walk as graph_walk

#: the symbol transformers.js substitutes the call's batch for (and ``batch_size x num_heads``: merged-head caches)
BATCH_SYMBOL = "batch_size"
KNOWN_SYMBOLS = frozenset({BATCH_SYMBOL, "batch_size x num_heads"})
#: transformers.js's cache input names (``getCacheNames``): ``past_key_values.{i}.key|value``, ``past_conv.{i}``
CACHE_PREFIXES = ("past_key_values.", "past_conv.")


def cache_inputs(model: ir.Model) -> list[ir.Value]:
    """The graph inputs transformers.js fills with an empty cache on the first call."""
    return [v for v in model.graph.inputs if v.name and v.name.startswith(CACHE_PREFIXES)]


def batch_symbols(model: ir.Model) -> dict[str, list[str]]:
    """{symbol: cache inputs} for cache inputs whose batch axis (axis 0) is a symbol transformers.js sizes to 0."""
    found: dict[str, list[str]] = {}
    for value in cache_inputs(model):
        if value.shape is None or len(value.shape) == 0:
            continue
        dim = value.shape[0]
        if isinstance(dim, ir.SymbolicDim) and dim.value is not None and dim.value not in KNOWN_SYMBOLS:
            found.setdefault(dim.value, []).append(str(value.name))
    return found


def symbol_users(model: ir.Model, symbol: str) -> list[ir.Value]:
    """Every value of the model (inputs, outputs, node outputs, all graphs) with ``symbol`` in its shape."""
    seen: dict[int, ir.Value] = {}
    for graph in graph_walk.graphs(model):
        values = [*graph.inputs, *graph.outputs, *(o for node in graph for o in node.outputs)]
        for value in values:
            if value.shape is not None and any(isinstance(d, ir.SymbolicDim) and d.value == symbol
                                               for d in value.shape):
                seen.setdefault(id(value), value)
    return list(seen.values())
