"""onnxruntime-node's backend (``check --runtime onnxruntime-node``): the WebGPU runs of a check on onnxruntime-node's
own WebGPU execution provider (native code with its own Dawn, on the machine's Vulkan adapter), driven from this
process through ``node node_driver.mjs`` (:mod:`rope_passes.runtime.web`, host ``onnxruntime-node``); the CPU runs
(the reference) on onnxruntime's CPU EP here, as for the browser.

Its choices in the loop (:class:`NodeBackend`): a reference run makes each schedule twice and each padded row alone,
and the schedules and sweep run after a failed decode, as the Python runtimes do (onnxruntime-node is a native
runtime: a call that fails does not take the process with it). Graph capture is not driven on it: onnxruntime-node
1.30 has no GPU-buffer tensors (``Tensor.fromGpuBuffer``, ``preferredOutputLocation: 'gpu-buffer'`` are
onnxruntime-web's), so a run cannot bind the fixed buffers a captured graph replays on; a captured run is "could
not run" there, said so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rope_passes.check.backends.web import WebBackend
from rope_passes.check.spec import RunSpec
from rope_passes.errors import UsageError

WHAT = "the onnxruntime-node runtime"


def missing() -> str | None:
    """Why onnxruntime-node cannot run here (None: it can), with the command that sets it up."""
    from rope_passes.runtime.web.install import ORT_NODE
    from rope_passes.runtime.web.install import missing as host_missing

    return host_missing(ORT_NODE)


def backend(spec: RunSpec) -> NodeBackend | None:
    """onnxruntime-node runs the WebGPU runs of a check; None for the others (onnxruntime's CPU EP here)."""
    return NodeBackend() if spec.ep == "webgpu" else None


class NodeBackend(WebBackend):
    """One run on onnxruntime-node's WebGPU EP (one Node process per checker process)."""

    what = WHAT
    reference_runs = True
    after_failure = True

    def __init__(self) -> None:
        from rope_passes.runtime.web.install import ORT_NODE

        super().__init__(host=ORT_NODE)

    def notes(self) -> list[str]:
        return [f"onnxruntime-node's WebGPU EP (its own Dawn); the adapter Dawn for Node finds here: "
                f"{self.browser.adapter_summary}"]

    def capture(self, spec: RunSpec, table: np.ndarray | None, captured: bool = True) -> Any:
        raise UsageError("graph capture is not driven on onnxruntime-node: it has no GPU-buffer tensors to bind the "
                         "fixed buffers a captured graph replays on")


__all__ = ["WHAT", "NodeBackend", "backend", "missing"]
