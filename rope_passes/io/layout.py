"""The optimum / transformers.js folder layout: one home for where its files are.

What users download from the Hugging Face Hub for transformers.js (``onnx-community/*``, optimum exports)::

    config.json  generation_config.json  tokenizer.json  tokenizer_config.json ...
    onnx/model.onnx  onnx/model.onnx_data  onnx/model_fp16.onnx  onnx/model_q4f16.onnx  onnx/model_quantized.onnx ...

transformers.js 4.3 reads ``config.json`` from the folder and ``onnx/model{suffix}.onnx`` by dtype (``fp32``: no
suffix, ``fp16``, ``q4f16``, ``quantized``, ...), external data as ``onnx/model{suffix}.onnx_data`` (``_data_1``, ...
for chunks) only when ``config.json``'s ``transformers.js_config.use_external_data_format`` says so. The folder is
the model folder: the model is ``onnx/model.onnx`` (else ``onnx/decoder_model_merged.onnx``, the older name); the
other ``.onnx`` files in ``onnx/`` are its *siblings* (other dtypes of the same graph), carried to the output as they
are (reflinked or copied, never rewritten). A sibling is optimized by naming its file (docs/runtimes.md).
"""

from __future__ import annotations

from pathlib import Path

#: the subfolder transformers.js (and optimum's Hub exports) keep the graphs in
ONNX_SUBFOLDER = "onnx"
#: the Hugging Face config beside the subfolder (transformers.js reads it; the RP4xx rules and precompute-cos-sin too)
HF_CONFIG_NAME = "config.json"
#: the model of the folder, in the order looked for: transformers.js 3+/4 name, then the v2 merged decoder
MODEL_NAMES = ("model.onnx", "decoder_model_merged.onnx")
#: transformers.js's external data name: ``<model>.onnx_data`` (not onnx_ir's ``<model>.onnx.data``)
DATA_SUFFIX = "_data"


def is_transformers_js_folder(folder: Path) -> bool:
    """``folder`` holds ``config.json`` and an ``onnx/`` subfolder with a model in it, and no ``.onnx`` of its own."""
    sub = folder / ONNX_SUBFOLDER
    return ((folder / HF_CONFIG_NAME).is_file() and sub.is_dir() and any(p.is_file() for p in sub.glob("*.onnx"))
            and not any(p.is_file() for p in folder.glob("*.onnx")))


def transformers_js_model(folder: Path) -> Path | None:
    """The model of a transformers.js folder (see the module doc), or None when ``onnx/`` holds none of those names."""
    for name in MODEL_NAMES:
        if (folder / ONNX_SUBFOLDER / name).is_file():
            return folder / ONNX_SUBFOLDER / name
    return None


def in_transformers_js_folder(model_path: Path) -> bool:
    """The model file sits in the ``onnx/`` subfolder of a transformers.js folder."""
    parent = model_path.parent
    return parent.name == ONNX_SUBFOLDER and (parent.parent / HF_CONFIG_NAME).is_file()


def model_root(model_path: Path) -> Path:
    """The folder whose folder-level files (``config.json``, ``genai_config.json``, tokenizer) belong to this model:
    the transformers.js folder for a model in its ``onnx/``, else the model's own folder."""
    return model_path.parent.parent if in_transformers_js_folder(model_path) else model_path.parent


def siblings(model_path: Path) -> list[Path]:
    """The other graphs of a transformers.js folder's ``onnx/`` (other dtypes), sorted; [] outside that layout."""
    if not in_transformers_js_folder(model_path):
        return []
    return sorted(p for p in model_path.parent.glob("*.onnx") if p.is_file() and p.name != model_path.name)
