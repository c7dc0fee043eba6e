"""Model I/O users can trust.

* :mod:`.load`: ``load_bundle`` reads a ``.onnx`` file or a genai model folder (``model.onnx`` + ``genai_config.json``
  + tokenizer files) with onnx_ir, weights lazy but every external-data reference checked up front;
  ``discover_models`` walks a folder of model folders.
* :mod:`.paths`: where each output goes and every check on an output path (``plan_outputs``, ``output_target``,
  report files).
* :mod:`.save`: ``save_bundle`` / ``write_bundle``: nothing lost, atomic, the input never modified unless
  ``in_place=True``, an unchanged model copied byte for byte; :mod:`.weights`: untouched weights are reused
  (reflink, copy or hard link), not rewritten; :mod:`.disk`: staging, all-or-nothing commits, cheap copies.
"""

from __future__ import annotations

from rope_passes.io.load import (
    MAX_IR_VERSION,
    ModelBundle,
    discover_models,
    external_tensors,
    find_model_file,
    lint_targets,
    load_bundle,
    load_model,
    model_of,
    resolve_model_path,
)
from rope_passes.io.paths import (
    ModelJob,
    OutputTarget,
    check_output,
    check_output_given,
    check_report_path,
    output_target,
    plan_outputs,
    write_report,
)
from rope_passes.io.save import SaveResult, copies_verbatim, save_bundle, write_bundle
from rope_passes.io.weights import SMALL_TENSOR_BYTES, WEIGHT_MODES

__all__ = [
    "MAX_IR_VERSION",
    "SMALL_TENSOR_BYTES",
    "ModelBundle",
    "ModelJob",
    "OutputTarget",
    "SaveResult",
    "WEIGHT_MODES",
    "check_output",
    "check_output_given",
    "check_report_path",
    "copies_verbatim",
    "discover_models",
    "external_tensors",
    "find_model_file",
    "lint_targets",
    "load_bundle",
    "load_model",
    "model_of",
    "output_target",
    "plan_outputs",
    "resolve_model_path",
    "save_bundle",
    "write_bundle",
    "write_report",
]
