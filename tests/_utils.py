"""What every test shares: one model serializer, one onnxruntime runner, and the checker's tolerances.

* :func:`serialize` / :func:`save`: an ``onnx_ir`` model as ModelProto bytes (or a file), the IR version capped at
  what onnxruntime 1.27 loads; the model itself is not changed.
* :func:`run`: one call of a model (an ``ir.Model``, bytes or a path) on ``"cpu"`` or ``"webgpu"`` through
  :func:`rope_passes.runtime.sessions.create_session`, so a WebGPU run really runs on WebGPU (it raises on a silent
  CPU fallback: a test that uses it fails, never skips, without an adapter).
* :data:`TOLERANCES`: the per-precision tolerances ``rope-passes check`` compares with (one home:
  :mod:`rope_passes.check.compare`), for tests that assert "as close as the checker requires".
* :func:`exporter_feeds` / :func:`exporter_outputs`: fixed-seed calls of an exporter decoder (any batch, length and
  past; 3D ``position_ids`` for mRoPE graphs), for comparing an export with its rewrite on the CPU EP.
* :func:`realsize`: ``bench/realsize.py`` as a module (the real-size graph builder the bench and its tests share).
* :func:`copy_folder`: a writable copy of a read-only model folder (the shared corpus) with its genai_config.json
  edited.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx_ir as ir

from rope_passes.check.compare import TOLERANCES, Tolerance
from rope_passes.io import MAX_IR_VERSION
from rope_passes.runtime.sessions import create_session

__all__ = ["TOLERANCES", "Tolerance", "copy_folder", "exporter_feeds", "exporter_outputs", "realsize", "run", "save",
           "serialize"]

REPO = Path(__file__).resolve().parent.parent


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


def exporter_feeds(sess: Any, batch: int, seq: int, past: int) -> dict[str, np.ndarray]:
    """One call of an exporter decoder session: ``seq`` new tokens after a random past of ``past`` (fixed seed per
    call shape); ``position_ids`` continue the past (tiled to the three mRoPE axes where the input is 3D)."""
    rng = np.random.RandomState(1000 * batch + 10 * seq + past)
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.randint(0, 256, (batch, seq)).astype(np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((batch, past + seq), np.int64)
        elif i.name == "position_ids":
            pos = np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))
            feeds[i.name] = np.stack([pos] * 3) if len(i.shape) == 3 else pos
        else:  # past_key_values.<i>.key|value [batch, kv heads, past, head dim]
            feeds[i.name] = (0.5 * rng.randn(batch, i.shape[1], past, i.shape[3])).astype(np.float32)
    return feeds


def exporter_outputs(path: str | os.PathLike, calls: Any) -> list[list[np.ndarray]]:
    """Every output of each ``(batch, seq, past)`` call of :func:`exporter_feeds` on the CPU EP."""
    sess = create_session(str(path), "cpu")
    return [sess.run(None, exporter_feeds(sess, *c)) for c in calls]


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py``, imported once (registered in ``sys.modules``: dataclasses look their module up, and
    bench modules import each other by name)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def realsize() -> ModuleType:
    """``bench/realsize.py`` (:func:`bench_module`)."""
    return bench_module("realsize")


def copy_folder(src: str | os.PathLike, dst: str | os.PathLike, edit: Any = None) -> Path:
    """A writable copy of model folder ``src`` at ``dst`` (the corpus files are read-only); ``edit(config)`` changes
    its genai_config.json's JSON in place first."""
    import json
    import shutil

    folder = Path(dst)
    shutil.copytree(src, folder)
    for p in folder.iterdir():
        p.chmod(0o644)
    if edit is not None:
        path = folder / "genai_config.json"
        config = json.loads(path.read_text())
        edit(config)
        path.write_text(json.dumps(config, indent=4))
    return folder


# -- building wrong rewrites: one node appended to a graph at a time (tests/test_check_schedules.py, test_check_clients.py)


def graph_op(graph: ir.Graph, op_type: str, *inputs: ir.Value, **attrs) -> ir.Value:
    """Append ``op_type(inputs, attrs)`` to ``graph``; its first output."""
    node = ir.node(op_type, list(inputs), attributes=attrs or None)
    graph.append(node)
    return node.outputs[0]


def graph_const(graph: ir.Graph, value) -> ir.Value:
    return graph_op(graph, "Constant", value=ir.tensor(np.asarray(value)))


def graph_dim(graph: ir.Graph, value: ir.Value, axis: int) -> ir.Value:
    """``Shape(value)[axis]`` as a scalar int64."""
    return graph_op(graph, "Gather", graph_op(graph, "Shape", value), graph_const(graph, np.int64(axis)), axis=0)
