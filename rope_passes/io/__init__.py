"""Model I/O users can trust.

* :mod:`.load`: ``load_bundle`` reads a ``.onnx`` file or a genai model folder (``model.onnx`` + ``genai_config.json``
  + tokenizer files) with onnx_ir, weights lazy but every external-data reference checked up front;
  ``discover_models`` walks a folder of model folders.
* :mod:`.paths`: where each output goes and every check on an output path (``plan_outputs``, ``output_target``,
  report files).
* :mod:`.save`: ``save_bundle`` / ``write_bundle``: nothing lost, atomic, the input never modified unless
  ``in_place=True``, an unchanged model copied byte for byte.
"""

from __future__ import annotations

from rope_passes.io.load import (
    MAX_IR_VERSION,
    ModelBundle,
    discover_models,
    external_tensors,
    find_model_file,
    load_bundle,
    load_model,
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
from rope_passes.io.save import SMALL_TENSOR_BYTES, SaveResult, copies_verbatim, save_bundle, write_bundle

__all__ = [
    "MAX_IR_VERSION",
    "SMALL_TENSOR_BYTES",
    "ModelBundle",
    "ModelJob",
    "OutputTarget",
    "SaveResult",
    "check_output",
    "check_output_given",
    "check_report_path",
    "copies_verbatim",
    "discover_models",
    "external_tensors",
    "find_model_file",
    "load_bundle",
    "load_model",
    "output_target",
    "plan_outputs",
    "resolve_model_path",
    "save_bundle",
    "write_bundle",
    "write_report",
]
