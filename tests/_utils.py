"""What every test shares: one model serializer, one onnxruntime runner, and the checker's tolerances.

* :func:`serialize` / :func:`save`: an ``onnx_ir`` model as ModelProto bytes (or a file), the IR version capped at
  what onnxruntime 1.27 loads; the model itself is not changed.
* :func:`run`: one call of a model (an ``ir.Model``, bytes or a path) on ``"cpu"`` or ``"webgpu"`` through
  :func:`rope_passes.runtime.sessions.create_session`, so a WebGPU run really runs on WebGPU (it raises on a silent
  CPU fallback: a test that uses it fails, never skips, without an adapter).
* :data:`TOLERANCES`: the per-precision tolerances ``rope-passes check`` compares with (one home:
  :mod:`rope_passes.check.compare`), for tests that assert "as close as the checker requires".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from rope_passes.check.compare import TOLERANCES, Tolerance
from rope_passes.io import MAX_IR_VERSION
from rope_passes.runtime.sessions import create_session

__all__ = ["TOLERANCES", "Tolerance", "run", "save", "serialize"]


def serialize(model: ir.Model) -> bytes:
    """``model`` as ModelProto bytes, IR version at most :data:`~rope_passes.io.MAX_IR_VERSION`."""
    proto = ir.serde.serialize_model(model)
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    return proto.SerializeToString()


def save(model: ir.Model, path: str | os.PathLike) -> Path:
    """:func:`serialize` into one file (weights inline); returns the path."""
    path = Path(path)
    path.write_bytes(serialize(model))
    return path


def run(
    model: ir.Model | bytes | str | os.PathLike,
    feeds: Mapping[str, np.ndarray],
    ep: str = "cpu",
    **session: Any,
) -> list[np.ndarray]:
    """Every output of one call of ``model`` on ``ep``; ``session`` goes to ``create_session`` (graph_capture, ...)."""
    source = serialize(model) if isinstance(model, ir.Model) else model
    return create_session(source, ep, **session).run(None, dict(feeds))
