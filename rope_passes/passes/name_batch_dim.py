"""``name-batch-dim``: name the cache inputs' batch axis ``batch_size``, as transformers.js needs (lint RP501).

**Changes metadata only**: it renames one dimension *symbol* (``batch`` → ``batch_size``) wherever the model's
value types use it (graph inputs, outputs, value_info, subgraphs). No node, initializer, attribute, opset or value
changes, so every output is bit-identical for every input (a symbol is a name for a free dimension; onnxruntime
binds it per call). It is a repair of what a client reads, not an optimization: transformers.js 4.3 sizes the
first call's empty past from the cache inputs' metadata (:mod:`rope_passes.analysis.client_io`), reading any
batch symbol but ``batch_size`` as 0, and the graph's first Reshape then fails.

It runs only when asked (``lint --fix`` after RP501, or ``optimize --passes name-batch-dim``): no preset holds it.
Refused, with nothing changed, when the cache inputs disagree on their batch symbol or when ``batch_size`` already
names another dimension of the graph (renaming would claim two free dimensions equal).
"""

from __future__ import annotations

import onnx_ir as ir

from rope_passes.analysis.client_io import BATCH_SYMBOL, batch_symbols, symbol_users
from rope_passes.passes.base import RopePass
from rope_passes.report import MatchFailure, PassReport


class NameBatchDimPass(RopePass):
    name = "name-batch-dim"
    summary = "name the cache inputs' batch axis batch_size for transformers.js (metadata only; not in a preset)"

    def apply(self, model: ir.Model, report: PassReport) -> None:
        found = batch_symbols(model)
        if not found:
            raise MatchFailure.absent(f"no cache input (past_key_values.*) names its batch axis other than "
                                      f"{BATCH_SYMBOL!r}")
        if len(found) > 1:
            names = ", ".join(f"{s!r} ({inputs[0]})" for s, inputs in sorted(found.items()))
            raise MatchFailure.refuse(f"the cache inputs name their batch axis differently: {names}")
        (old, inputs), = found.items()
        taken = symbol_users(model, BATCH_SYMBOL)
        if taken:
            raise MatchFailure.refuse(f"{BATCH_SYMBOL!r} already names a dimension of {taken[0].name!r}: renaming "
                                      f"{old!r} to it would claim the two equal", str(taken[0].name))
        users = symbol_users(model, old)
        for value in users:
            assert value.shape is not None  # symbol_users found the symbol in it
            value.shape = ir.Shape([ir.SymbolicDim(BATCH_SYMBOL) if isinstance(d, ir.SymbolicDim) and d.value == old
                                    else d for d in value.shape])
        report.metadata_changes.append(f"dim {old!r} renamed {BATCH_SYMBOL!r} in {len(users)} value types "
                                       f"({inputs[0]}, ...): transformers.js sizes the empty past from it")
