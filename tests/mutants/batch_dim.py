"""Mutants attacking ``name-batch-dim`` (a metadata-only repair, in no preset: run with ``passes=[...]``).

The pass renames the cache inputs' batch symbol to ``batch_size``. Renaming is exact only while ``batch_size`` names
no other free dimension: two dimensions with one symbol are claimed equal. The mutant names the prompt's sequence
axis ``batch_size`` (a dynamo export whose batch axis is ``batch``): the pass must refuse, naming the value, and
leave every value type as it was.
"""

from __future__ import annotations

import onnx_ir as ir

from . import REFUSE, Mutant, Work
from .edit import graph_input

PASS = "name-batch-dim"
LLAMA = "torch/tf5/dynamo/llama/decode.onnx"


def sequence_named_batch_size(work: Work) -> list[str]:
    ids = graph_input(work.graph, "input_ids")
    assert ids.shape is not None
    ids.shape = ir.Shape([ids.shape[0], ir.SymbolicDim("batch_size")])
    return ["input_ids"]


def mutants() -> list[Mutant]:
    return [
        Mutant("name-batch-dim-llama-symbol-taken", "naming", PASS, LLAMA, REFUSE, sequence_named_batch_size,
               "input_ids' sequence axis is already named batch_size: renaming the batch axis to it would claim "
               "batch == sequence length", target=None),
    ]
