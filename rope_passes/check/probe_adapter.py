"""``python -m rope_passes.check.probe_adapter``: exit 0 when onnxruntime gets a real WebGPU adapter, else 1.

Runs a one-node graph on WebGpuExecutionProvider and checks the session did not silently fall back to CPU.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto, helper


def tiny_add_model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def probe() -> str | None:
    """None when WebGPU works, else the reason."""
    from rope_passes.check.runtime import create_session

    try:
        sess = create_session(tiny_add_model(), "webgpu")
        y = sess.run(None, {"x": np.arange(4, dtype=np.float32)})[0]
    except Exception as exc:  # noqa: BLE001 - any failure means no adapter
        return " ".join(str(exc).split())
    if not np.array_equal(y, 2 * np.arange(4, dtype=np.float32)):
        return f"WebGPU computed a wrong result: {y}"
    return None


if __name__ == "__main__":
    reason = probe()
    print("webgpu: ok" if reason is None else f"webgpu: unavailable: {reason}")
    sys.exit(0 if reason is None else 1)
