"""Lint rules about the JavaScript clients that load a folder (RP5xx): what stops transformers.js.

RP501 reads :func:`rope_passes.analysis.client_io.batch_symbols`, the same fact its fix (``name-batch-dim``) reads.
It is reported for a model in a transformers.js folder (``config.json`` + ``onnx/``, :mod:`rope_passes.io.layout`):
the layout says which client loads it; a lone ``.onnx`` may be run by onnxruntime directly, which binds any symbol.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rope_passes.analysis.client_io import BATCH_SYMBOL, batch_symbols
from rope_passes.io.layout import in_transformers_js_folder
from rope_passes.lint.core import LintContext, Severity, rule


@rule("RP501", "transformers-js-batch-dim", Severity.ERROR,
      "a cache input's batch axis is not named batch_size: transformers.js's first call fails",
      """transformers.js 4.3 makes the first call's empty past from each cache input's metadata shape
      (`addPastKeyValues`): the symbols `batch_size` (and `batch_size x num_heads`) become the call's batch, every
      other symbol 0. A graph whose `past_key_values.*` inputs name their batch axis otherwise (torch's dynamo
      exporter with `dynamic_shapes` naming it `batch`) gets `[0, kv_heads, 0, head_dim]` pasts, and its first
      Reshape fails (`requested shape:{0,7,-1,16}`). Reported for models in a transformers.js folder
      (`config.json` + `onnx/model.onnx`). `name-batch-dim` renames the symbol, a metadata-only repair (no node or
      value changes); it runs only when asked (`lint --fix`, `optimize --passes name-batch-dim`), in no preset.
      Repro: [transformers-js-batch-dim.md](transformers-js-batch-dim.md).""",
      fix="name-batch-dim")
def transformers_js_batch_dim(ctx: LintContext) -> Iterator[tuple[str, str]]:
    if not in_transformers_js_folder(Path(ctx.path)):
        return
    for symbol, inputs in sorted(batch_symbols(ctx.model).items()):
        more = f" and {len(inputs) - 1} more cache inputs" if len(inputs) > 1 else ""
        yield inputs[0], (f"cache input {inputs[0]!r}{more} name their batch axis {symbol!r}, not {BATCH_SYMBOL!r}: "
                          f"transformers.js sizes it 0 in the first call's empty past and the graph fails")
